"""The harness's two jobs. The LoadGen run, at this package's top: the SUT adapters (Offline,
Server, Interactive) and QSL, the run configuration (user.conf), the run CLI (`python -m harness
run`) and the run worker. The prediction, in harness.predict: a run simulated on the engine's own
scheduler, for a capacity in seconds. The measurement, in harness.measure: the load calibration, the capacity
search and the measurement report, which drive those runs. Beside them, the `make submission` chain
(`python -m harness.submission`): the runs, then compliance's packager and checker."""
