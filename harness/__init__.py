"""LoadGen harnesses (Offline, Server, Interactive, SingleStream), datasets and QSL, run CLI. Not built yet."""
