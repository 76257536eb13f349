"""LoadGen harnesses (Offline, Server, Interactive), datasets and QSL, and the run CLI
(`python -m harness run`)."""
