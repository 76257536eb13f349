"""How long LoadGen runs take, before they run: the time estimates that the `make submission` chain
(harness/submission.py: its demo budget), the load calibration (its budget for the search and the
runs after it) and the capacity searches' trials (calibrate.py, ablation.py) share. A user.conf is
read through the registry's `conf_value` (systems/benchmarks.py); a latency scenario's settings are
LoadGen's Server keys, under the scenario's LoadGen model name (Benchmark.loadgen_name)."""

from systems.benchmarks import conf_value

RUN_START_S = 10.0  # a run's process start, model load and warm-up, in the chain's time estimates
TEST06_QUERIES = 100  # compliance/TEST06.audit.config
# A latency scenario's performance run that LoadGen found INVALID (a machine that slowed since its
# calibration: measurements/README.md) runs again once at this share of its rate (harness/submission.py),
# and a budgeted search leaves the time for it (calibrate.py).
LATENCY_RERUN_SHARE = 0.9


def performance_seconds(user_conf: str, loadgen_model: str, default_queries: int) -> float:
    """How long a latency scenario's performance run of `user_conf` (its text; `loadgen_model`'s
    Server settings) takes at its target_qps when the rate is met: its min_duration or its
    min_query_count's arrivals (`default_queries` where it sets none), whichever is longer, and its
    start."""
    qps = float(conf_value(user_conf, loadgen_model, "Server", "target_qps"))
    queries = conf_value(user_conf, loadgen_model, "Server", "min_query_count")
    duration = conf_value(user_conf, loadgen_model, "Server", "min_duration")
    arrivals = (int(queries) if queries else default_queries) / qps
    return max(int(duration) / 1000 if duration else 0.0, arrivals) + RUN_START_S


def accuracy_and_test06_seconds(user_conf: str, loadgen_model: str, dataset_size: int) -> float:
    """How long a latency scenario's accuracy run (the whole dataset) and TEST06 (its queries) take
    at the target_qps of `user_conf`, each arriving at that rate, and each run's start."""
    qps = float(conf_value(user_conf, loadgen_model, "Server", "target_qps"))
    return (dataset_size + TEST06_QUERIES) / qps + 2 * RUN_START_S


def predicted_minutes(user_conf: str, loadgen_model: str, dataset_size: int) -> float:
    """How long a latency scenario's three runs take at the target_qps of `user_conf` (its text;
    `loadgen_model`'s Server settings): the performance run (`performance_seconds`, the dataset's
    size of queries where it sets none), then its accuracy and TEST06 runs."""
    performance = performance_seconds(user_conf, loadgen_model, dataset_size)
    return (performance + accuracy_and_test06_seconds(user_conf, loadgen_model, dataset_size)) / 60
