"""The harness's measurement, apart from the LoadGen run it measures (harness/'s top): the load
calibration and the capacity search, the time estimates, the measurement report and its runs, a
user's traffic and its replay. It drives the runs (`python -m harness run`, harness.run_worker);
the runs never import it."""
