"""LoadGen harnesses (Offline, Server, Interactive) and QSL, the load calibration, and the run CLI
(`python -m harness run`)."""
