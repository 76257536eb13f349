"""Which run a LoadGen detail log is of, against the run folder it sits in: its test mode, its
scenario and, where the log shows it, its benchmark. The checker (compliance/check.py) reads every
detail log of a tree with it and the packager (compliance/package.py) every run it packages, so that
a run made in another mode, scenario or benchmark is never packaged or scored as the folder's.

What a detail log shows (LoadGen 6.0.17): `effective_test_mode` and `effective_scenario`, with an
Interactive run logged as "Server" (a Server run under the "-interactive" model's settings), and no
model name. A Server or Interactive run, in either mode, logs the TTFT/TPOT limits mlperf.conf set for
the model it was given (`requested_server_ttft_latency`, `requested_server_tpot_latency`): distinct
for each benchmark and scenario, they are the log's one trace of both. An Offline log shows no
benchmark.
"""

from compliance.audit_config import AUDIT_CONFIGS, TEST_MODES, read_audit_config
from systems.benchmarks import Benchmark

# The LoadGen test mode of a `harness run --mode performance` or `accuracy` run (harness/config.py);
# a compliance test's run is in the mode its audit.config sets.
RUN_TEST_MODES = {"performance": "PerformanceOnly", "accuracy": "AccuracyOnly"}


def expected_test_mode(run: str) -> str:
    """The `effective_test_mode` of the run in a run folder named `run` (performance, accuracy, TEST0x)."""
    if run in AUDIT_CONFIGS:
        return TEST_MODES[read_audit_config(AUDIT_CONFIGS[run])["mode"]]
    return RUN_TEST_MODES[run]


def latency_limits_mismatch(values: dict, benchmark: Benchmark, scenario: str) -> str | None:
    """Why a Server or Interactive run's detail-log values show that LoadGen was not given
    `benchmark`'s TTFT/TPOT limits of `scenario`; None when it was, or the scenario has none."""
    if scenario not in benchmark.latency_limits_ms:
        return None
    ttft_limit, tpot_limit = benchmark.latency_limits_ms[scenario]
    requested = (values.get("requested_server_ttft_latency"), values.get("requested_server_tpot_latency"))
    if requested == (ttft_limit * 1_000_000, tpot_limit * 1_000_000):
        return None
    got = "/".join("missing" if v is None else f"{v / 1e6:g}" for v in requested)
    return (
        f"LoadGen ran with TTFT/TPOT limits {got} ms, not the {scenario} limits {ttft_limit}/{tpot_limit} ms "
        f"of {benchmark.name}"
    )


def identity_mismatches(values: dict, run: str, scenario: str, benchmark: Benchmark) -> list[str]:
    """How a detail log's values (compliance.loadgen_logs.read_detail_log) show that its run is not
    the `run` (performance, accuracy, TEST0x) of `benchmark` in `scenario`; empty when they agree."""
    mismatches = []
    mode = expected_test_mode(run)
    if values.get("effective_test_mode") != mode:
        mismatches.append(f"effective_test_mode is {values.get('effective_test_mode')!r}, not {mode!r}")
    logged_as = "Server" if scenario == "Interactive" else scenario
    if values.get("effective_scenario") != logged_as:
        named = " (LoadGen's name for Interactive)" if scenario == "Interactive" else ""
        mismatches.append(f"effective_scenario is {values.get('effective_scenario')!r}, not {logged_as!r}{named}")
    else:  # the limits tell the benchmark, and Server from Interactive, only in a Server run's log
        limits = latency_limits_mismatch(values, benchmark, scenario)
        mismatches += [limits] if limits else []
    return mismatches
