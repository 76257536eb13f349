"""The latency and validity audit of one performance run's `mlperf_log_detail.txt`.

A run passes only if LoadGen says VALID, logged no error, and (Server and Interactive) its p99
TTFT and TPOT are strictly below the limits of its own scenario (the registry's,
systems/benchmarks.py). The official checker applies the Server limits to an Interactive directory
(its effective scenario is Server); this audit applies the Interactive ones (mlperf-rules.md section
5). That LoadGen was given exactly those limits is part of the run's identity, which the checker
reads in every detail log (compliance/run_identity.py).
"""

from systems.benchmarks import Benchmark


def audit_values(values: dict, errors: list[str], benchmark: Benchmark, scenario: str) -> list[str]:
    """Failures of one run's detail-log values (see the module docstring); empty when it passes."""
    failures = [f"LoadGen logged an error: {e}" for e in errors]
    if values.get("result_validity") != "VALID":
        failures.append(f"LoadGen result is {values.get('result_validity', 'missing')}, not VALID")
    if not values.get("requested_use_token_latencies"):
        failures.append("token latencies were not on (requested_use_token_latencies)")
    if scenario in ("Server", "Interactive"):
        if scenario not in benchmark.latency_limits_ms:  # an edge benchmark has no Server
            return failures + [f"{benchmark.loadgen_model} has no {scenario} TTFT/TPOT limits"]
        ttft_limit, tpot_limit = benchmark.latency_limits_ms[scenario]
        for name, key, limit in (
            ("TTFT", "result_first_token_99.00_percentile_latency_ns", ttft_limit),
            ("TPOT", "result_time_per_output_token_99.00_percentile_ns", tpot_limit),
        ):
            value = values.get(key)
            if value is None:
                failures.append(f"p99 {name} missing ({key})")
            elif not value < limit * 1_000_000:
                failures.append(f"p99 {name} {value / 1e6:.1f} ms is not below the {scenario} limit of {limit} ms")
    return failures
