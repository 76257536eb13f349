"""The capacity model (harness/predict): LoadGen's Server schedule to the nanosecond and its verdict
to the query, against a real LoadGen run's logs (tests/data/loadgen_interactive_run.json)."""

import json
from pathlib import Path

import pytest

from harness.predict.loadgen_schedule import mt19937, server_schedule
from harness.predict.verdict import min_passing_queries, odds, server_result

RUN = json.loads((Path(__file__).parent / "data" / "loadgen_interactive_run.json").read_text())


def test_mt19937_is_the_standard_one():
    """The C++ standard's check of std::mt19937: its 10000th output, default-seeded (5489), and
    a seed wider than 32 bits taken modulo 2^32 as libstdc++ takes it."""
    assert mt19937(5489).random_raw(10000)[-1] == 4123659995
    assert list(mt19937(5489 + 2**32).random_raw(3)) == list(mt19937(5489).random_raw(3))


def test_the_server_schedule_is_loadgens_to_the_nanosecond():
    """Every query's scheduled issue time in a LoadGen run's trace, and the detail log's generated
    query count and duration, from the run's rate, seed, min_duration and min_query_count."""
    times, duration = server_schedule(RUN["target_qps"], RUN["schedule_rng_seed"], RUN["min_duration_ms"], 460)
    assert len(times) == RUN["generated_query_count"] and duration == RUN["generated_query_duration_ns"]
    assert times == RUN["scheduled_ns"]
    # A longer run at the same rate issues until a query is scheduled past min_duration.
    long, _ = server_schedule(RUN["target_qps"], RUN["schedule_rng_seed"], 600_000, 460)
    assert long[:460] == times and long[-2] < 600e9 <= long[-1]


def test_the_verdict_is_loadgens_on_its_own_latencies():
    """The run's first-token latencies (3 of 460 over the 500 ms limit) give LoadGen's p99 and its
    early-stopping result: 541 more queries needed, so INVALID though the p99 is under the limit."""
    ttft = RUN["ttft_ns"]
    result = server_result(ttft, [1] * len(ttft), RUN["ttft_limit_ns"], 30_000_000)
    assert (
        result["result_first_token_99.00_percentile_latency_ns"]
        == RUN["result_first_token_99.00_percentile_latency_ns"]
    )
    over = sum(x > RUN["ttft_limit_ns"] for x in ttft)
    more = min_passing_queries(over) + over - len(ttft)
    assert f"Would need to run at least {more} more queries" in RUN["early_stopping_ttft_result"]
    assert result["early_stopping_met"] is False and result["result_validity"] == "INVALID"
    under = sorted(ttft)[:-over]
    assert (
        server_result(under * 2, [1] * 2 * len(under), RUN["ttft_limit_ns"], 30_000_000)["result_validity"] == "VALID"
    )


@pytest.mark.parametrize("t", [0, 1, 3, 10, 40])
def test_early_stopping_needs_the_fewest_queries_that_give_99_percent_confidence(t):
    """h is the least number of queries under the limit at which t over it still leave under 1%
    odds that the 99th percentile is over: one fewer does not (LoadGen's bracket never overshoots
    the least such h here)."""
    h = min_passing_queries(t)
    assert odds(h, t) < 0.01 <= odds(h - 1, t)
    assert min_passing_queries(0) == 459  # 0.99^459 < 0.01 <= 0.99^458


def constant_cost_engine(step_s: float, max_num_seqs: int = 1):
    from harness.predict.simulate import Engine
    from harness.predict.step_costs import StepCostModel
    from sut.config import EngineConfig

    costs = StepCostModel({"step": step_s, "prefill_token": 0.0, "decode_token": 0.0, "attention": 0.0}, 0.0, 0.0, 1)
    config = EngineConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=64, block_size=4)
    return Engine(config, num_blocks=4096, costs=costs, max_tokens=64)


@pytest.mark.parametrize("load", [0.3, 0.6])
def test_one_request_per_step_at_a_constant_cost_is_an_m_d_1_queue(load):
    """With one sequence at a time, one step per request and a constant step cost D, the simulated
    engine under LoadGen's Poisson arrivals is an M/D/1 queue: mean time to first token D + the
    Pollaczek-Khinchine wait rho D / (2 (1 - rho)), within a few percent over 20,000 queries."""
    from harness.predict.simulate import Workload, latencies_ns, run

    step_s, n = 0.010, 20_000
    times, _ = server_schedule(load / step_s, RUN["schedule_rng_seed"], 0, n)
    queries = run(constant_cost_engine(step_s), [t / 1e9 for t in times], [0] * n, Workload([[5, 6, 7]], [1]))
    ttft, _ = latencies_ns(queries)
    want = step_s + load * step_s / (2 * (1 - load))
    assert sum(ttft) / n / 1e9 == pytest.approx(want, rel=0.04)


def test_littles_law_holds_on_the_schedulers_in_flight_counts():
    """The scheduler's own count of requests in flight, averaged over virtual time, equals the
    arrival rate times the mean time a query spends in it, from its admission at a step's start to
    its completion (L = lambda W), on a batched, chunked run where queries overlap."""
    from harness.predict.simulate import Workload, run

    times, _ = server_schedule(40.0, RUN["schedule_rng_seed"], 0, 3000)
    workload = Workload([[i % 50 + 1] * (20 + 7 * i) for i in range(10)], [3 + 5 * i for i in range(10)])
    stretches = []
    queries = run(
        constant_cost_engine(0.004, max_num_seqs=8),
        [t / 1e9 for t in times],
        [i % 10 for i in range(3000)],
        workload,
        stretches,
    )
    span = sum(seconds for seconds, _ in stretches)
    average_in_flight = sum(seconds * count for seconds, count in stretches) / span
    arrival_rate = len(queries) / span
    mean_time = sum(end - admitted for _, admitted, _, end, _ in queries) / len(queries)
    assert average_in_flight > 2, "the queries overlap"
    assert average_in_flight == pytest.approx(arrival_rate * mean_time, rel=0.01)


def test_the_fit_recovers_known_step_costs_and_keeps_every_term_non_negative():
    """Steps costed by known terms (with 2% noise) give those terms back within a few percent; a
    term that costs nothing comes out at 0, never below."""
    import random

    from harness.predict.step_costs import TERMS, fit

    rng = random.Random(0)
    truth = {"step": 0.004, "prefill_token": 0.0003, "decode_token": 0.0, "attention": 2e-7}
    shapes = []
    for _ in range(300):
        prefill, decode = rng.choice([0, rng.randint(1, 512)]), rng.randint(0, 64)
        shapes.append(
            {
                "step": 1.0,
                "prefill_token": prefill,
                "decode_token": decode,
                "attention": (prefill + decode) * rng.randint(1, 400),
            }
        )
    seconds = [sum(truth[t] * s[t] for t in TERMS) * rng.uniform(0.98, 1.02) for s in shapes]
    model = fit(shapes, seconds)
    assert all(v >= 0 for v in model.seconds_per.values())
    for term in ("step", "prefill_token", "attention"):
        assert model.seconds_per[term] == pytest.approx(truth[term], rel=0.05)
    assert model.seconds_per["decode_token"] < 0.02 * truth["prefill_token"]
    assert model.median_error < 0.02 and model.steps == 300
    assert model.profiled[0] == [*(shapes[0][t] for t in TERMS), seconds[0]]  # kept, to refit later


def test_output_lengths_come_from_a_whole_accuracy_run(tmp_path):
    from harness.predict.predictor import PredictError, output_lengths

    log = tmp_path / "mlperf_log_accuracy.json"
    log.write_text(
        json.dumps([{"qsl_idx": 1, "token_count": 7, "data": ""}, {"qsl_idx": 0, "token_count": 3, "data": ""}])
    )
    assert output_lengths(log, 2) == [3, 7]
    with pytest.raises(PredictError, match=r"samples \[2\] have no response"):
        output_lengths(log, 3)
    with pytest.raises(PredictError, match="no accuracy log"):
        output_lengths(tmp_path / "none.json", 3)


def test_the_predict_command_profiles_once_and_prints_the_capacity_with_its_band(chain):
    """`python -m harness.predict` on the tiny system: the step costs profiled on its engine and
    saved with the machine, commit and settings; the last line the predicted capacity within its
    band; run again with two scheduling ablations, the saved model is reused for all three and the
    first configuration's prediction is the same."""
    import re
    import subprocess
    import sys

    from tests.tiny_system import one_thread

    root = chain[0]
    command = [sys.executable, "-m", "harness.predict", "--system", "tiny", "--scenario", "Server", "--root", str(root)]
    ablations = ["--configurations", '{"static_batching": true}', '{"enable_chunked_prefill": false}']
    runs = [
        subprocess.run(command + extra, capture_output=True, text=True, env=one_thread(), cwd=root)
        for extra in ([], ablations)
    ]
    for done in runs:
        assert done.returncode == 0, done.stderr[-2000:]
    first, second = (done.stdout.strip().splitlines() for done in runs)
    assert any("profiling the engine's steps" in line for line in first)
    # Configurations that differ in scheduling alone share the step-cost model.
    assert sum("step costs: reused" in line for line in second) == 3
    assert not any("profiling" in line for line in second)
    assert any(line.startswith('Server {"static_batching": true}: ') for line in second)
    found = re.fullmatch(r"predicted capacity: ([\d.]+) QPS \(band ([\d.]+)-([\d.]+)\)", first[-1])
    assert found, first[-1]
    qps, low, high = map(float, found.groups())
    assert low <= qps <= high and second[-1] == first[-1]
    assert "fit error median" in first[-2]
    saved = json.loads(next((root / "build" / "predict").rglob("step-costs-*.json")).read_text())
    assert set(saved["context"]) >= {"machine", "commit", "settings"} and saved["steps"] >= 4


def test_what_is_not_simulated_yet_is_refused_by_name():
    """A replica pool or a speculating engine is not predicted as if it were a plain one."""
    from types import SimpleNamespace

    from harness.predict.predictor import PredictError, simulated_engine
    from sut.config import EngineConfig
    from sut.config.speculative import SpeculativeConfig

    costs = constant_cost_engine(0.01).costs
    with pytest.raises(PredictError, match="only a single engine"):
        simulated_engine(SimpleNamespace(config=EngineConfig()), costs, 64)
    speculating = SimpleNamespace(config=EngineConfig(speculative_config=SpeculativeConfig("ngram", 2)), runner=None)
    with pytest.raises(PredictError, match="speculative decoding is not simulated"):
        simulated_engine(speculating, costs, 64)
    plain = simulated_engine(SimpleNamespace(config=EngineConfig(), runner=SimpleNamespace(num_blocks=99)), costs, 64)
    assert plain.num_blocks == 99 and plain.max_tokens == 64
