"""The capacity model (harness/predict): LoadGen's Server schedule to the nanosecond and its verdict
to the query, against a real LoadGen run's logs (tests/data/loadgen_interactive_run.json)."""

import json
import re
from pathlib import Path
from types import SimpleNamespace

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


def constant_cost_engine(step_s: float, max_num_seqs: int = 1, acceptance=None, **settings):
    from harness.predict.simulate import Engine
    from harness.predict.step_costs import StepCostModel
    from sut.config import EngineConfig

    costs = StepCostModel({"step": step_s}, 0.0, 0.0, 1)
    config = EngineConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=64, block_size=4, **settings)
    return Engine(config, num_blocks=4096, costs=costs, max_tokens=64, acceptance=acceptance or [])


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


def test_step_costs_drawn_from_a_runs_ratios_make_an_m_g_1_queue():
    """The steps costing the model's times a run's ratios in turn, here 0.5 or 1.5 at random (a
    spread of step times, mean 1, no slow stretches): the Pollaczek-Khinchine mean wait for service
    times S, lambda E[S^2] / (2 (1 - rho)), with E[S^2] = 1.25 D^2, longer than the M/D/1 queue's."""
    import random

    from harness.predict.simulate import Layout, Workload, latencies_ns, run

    step_s, n, load = 0.010, 20_000, 0.6
    times, _ = server_schedule(load / step_s, RUN["schedule_rng_seed"], 0, n)
    coin = random.Random(0)
    ratios = [coin.choice([0.5, 1.5]) for _ in range(50_000)]
    layout = Layout([constant_cost_engine(step_s)]).scaled(cost_ratios=ratios)
    ttft, _ = latencies_ns(run(layout, [t / 1e9 for t in times], [0] * n, Workload([[5, 6, 7]], [1])))
    want = step_s + (load / step_s) * 1.25 * step_s**2 / (2 * (1 - load))
    assert sum(ttft) / n / 1e9 == pytest.approx(want, rel=0.04)
    assert want > step_s + load * step_s / (2 * (1 - load))  # the M/D/1 wait


def test_a_runs_slow_stretch_is_kept_in_order_not_spread_thin():
    """The same step-cost ratios, a stretch of 100 slow steps among 900, replayed in order (a stall
    of the machine) give a longer p99 first-token time than shuffled (the stall spread thin)."""
    import random

    from harness.predict.simulate import Layout, Workload, latencies_ns, run
    from harness.predict.verdict import percentile

    step_s, n, load = 0.010, 5_000, 0.5
    times, _ = server_schedule(load / step_s, RUN["schedule_rng_seed"], 0, n)
    stretch = [1.0] * 900 + [3.0] * 100
    shuffled = random.Random(1).sample(stretch, len(stretch))
    p99 = []
    for ratios in (stretch, shuffled):
        layout = Layout([constant_cost_engine(step_s)]).scaled(cost_ratios=ratios)
        ttft, _ = latencies_ns(run(layout, [t / 1e9 for t in times], [0] * n, Workload([[5, 6, 7]], [1])))
        p99.append(percentile(ttft))
    assert p99[0] > 2 * p99[1]


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
    truth = {"step": 0.004, "prefill_token": 0.0003, "decode_token": 0.0, "draft_token": 0.0005, "attention": 2e-7}
    shapes = []
    for _ in range(300):
        prefill, decode = rng.choice([0, rng.randint(1, 512)]), rng.randint(0, 64)
        shapes.append(
            {
                "step": 1.0,
                "prefill_token": prefill,
                "decode_token": decode,
                "draft_token": rng.choice([0, decode // 2]),
                "attention": (prefill + decode) * rng.randint(1, 400),
            }
        )
    seconds = [sum(truth[t] * s[t] for t in TERMS) * rng.uniform(0.98, 1.02) for s in shapes]
    model = fit(shapes, seconds)
    assert all(v >= 0 for v in model.seconds_per.values())
    for term in ("step", "prefill_token", "draft_token", "attention"):
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


@pytest.mark.slow
def test_replicas_disaggregated_workers_and_speculation_are_profiled_where_they_run(chain):
    """Each layout's workers profile their own engines in their processes (at once), a
    disaggregated pool's handoff is measured, a speculating engine's acceptance is measured on the
    dataset; each gets a capacity."""
    import copy

    from harness.predict.predictor import predict_configuration

    root = chain[0]
    layouts = {
        "replicas": {"data_parallel_size": 2},
        "disaggregated": {"disaggregation": {"prefill": 1, "decode": 1}},
        "n-gram": {"speculative_config": {"method": "ngram", "num_speculative_tokens": 2}},
    }
    for name, settings in layouts.items():
        prediction = predict_configuration("tiny", "llama3.1-8b", "Server", root, copy.deepcopy(settings), log=print)
        assert prediction.qps and prediction.qps > 0, name
        costs = prediction.costs
        assert costs.steps >= 4 and costs.median_error < 1.0, name
        assert (costs.transfer_s_per_block > 0) == (name == "disaggregated"), name
        assert bool(costs.acceptance) == (name == "n-gram"), name
        assert all(0.0 <= a <= 1.0 for a in costs.acceptance)


def test_a_trial_whose_steps_cost_twice_the_model_re_anchors_the_prediction(tmp_path):
    """A run's steps.json against the step-cost model: real over modelled seconds; a failed trial
    whose steps cost twice the model's hints the capacity simulated at twice the costs: in virtual
    time that is the run at half the rate with every time doubled, so half the capacity found at
    half the latency limits."""
    from compliance.loadgen_logs import STEPS_FILE
    from harness.measure.calibrate import ReanchoredTrials
    from harness.measure.capacity import Trial
    from harness.predict.predictor import Prediction
    from harness.predict.simulate import Layout, Workload, capacity
    from harness.predict.step_costs import step_ratios
    from harness.run import write_steps

    engine = constant_cost_engine(0.010)
    workload = Workload([[5, 6, 7]], [1])
    schedule = {"schedule_rng_seed": RUN["schedule_rng_seed"], "sample_index_rng_seed": 1}
    schedule |= {"min_duration_ms": 0, "min_query_count": 2000, "limits_ms": (40.0, 100.0)}
    qps, _ = capacity(Layout([engine]), workload, schedule, schedule["limits_ms"], 10.0)
    prediction = Prediction(qps, qps, qps, engine.costs, 1, (Layout([engine]), workload, schedule))
    halved, _ = capacity(Layout([engine]), workload, schedule, (20.0, 50.0), 10.0)
    logs = tmp_path / "01-run"
    logs.mkdir()
    shape = {"step": 1.0, "prefill_token": 3.0, "decode_token": 0.0, "draft_token": 0.0, "attention": 6.0}
    write_steps(logs / STEPS_FILE, [(shape, 0.020)] * 50)
    assert step_ratios(logs / STEPS_FILE, engine.costs) == pytest.approx([2.0] * 50)
    assert step_ratios(tmp_path / "none.json", engine.costs) == []

    said = []
    trials = SimpleTrials(lambda q: Trial(q, False, "LoadGen INVALID", logs=logs), said.append)
    trial = ReanchoredTrials(trials, prediction)(qps)
    assert trial.hint_qps == pytest.approx(halved / 2, rel=0.03) and trial.hint_qps < qps / 2
    assert "its steps cost 2.00x the step-cost model's" in trial.detail and said


class SimpleTrials:
    """A search's trials in a test: `run(qps)` gives each Trial; `log` takes the search's lines."""

    def __init__(self, run, log):
        self.run, self.log = run, log

    def __call__(self, qps):
        return self.run(qps)


@pytest.mark.slow
def test_check_steps_compares_a_runs_steps_with_a_saved_model(chain, tmp_path):
    """check_steps: one LoadGen run with every step logged, its steps.json beside LoadGen's logs, and
    real / model time by kind of step; a model fitted to those very steps fits them (median 1)."""
    import subprocess
    import sys

    from compliance.loadgen_logs import STEPS_FILE
    from harness.predict.step_costs import fit
    from tests.tiny_system import one_thread

    root = chain[0]
    first = tmp_path / "first"
    command = [sys.executable, "-m", "harness.predict.check_steps", "--system", "tiny", "--scenario", "Offline"]
    costs = tmp_path / "costs.json"
    # A first run's own steps make the model the second run is checked against.
    constant_cost_engine(0.001).costs.save(costs)
    done = subprocess.run(
        [*command, "--costs", str(costs), "--out", str(first), "--root", str(root)],
        capture_output=True,
        text=True,
        env=one_thread(),
        cwd=root,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    logged = json.loads((first / "performance" / STEPS_FILE).read_text())
    shapes = [dict(zip(logged["columns"], row)) for row in logged["steps"]]
    fitted = fit(shapes, [shape["seconds"] for shape in shapes])
    fitted.save(costs)
    second = subprocess.run(
        [*command, "--costs", str(costs), "--out", str(tmp_path / "second"), "--root", str(root)],
        capture_output=True,
        text=True,
        env=one_thread(),
        cwd=root,
    )
    assert second.returncode == 0, second.stderr[-2000:]
    lines = second.stdout.splitlines()
    busy = next(line for line in lines if line.startswith("busy: "))
    real, modelled = (float(x) for x in re.findall(r"([\d.]+) s", busy)[:2])
    assert modelled == pytest.approx(real, rel=0.5), busy  # the same engine, a run later
    assert any(line.startswith(("decode: ", "mixed: ", "prefill: ")) for line in lines)


def test_two_replicas_share_the_load_by_outstanding_work():
    """Two replicas at twice the rate: each serves about half the queries, and a query waits no
    longer than on one replica at the single rate (the pool routes to the less loaded one)."""
    from harness.predict.simulate import Layout, Workload, latencies_ns, run

    step_s, n, load = 0.010, 4000, 0.6
    one = constant_cost_engine(step_s)
    times, _ = server_schedule(load / step_s, RUN["schedule_rng_seed"], 0, n)
    alone, _ = latencies_ns(run(one, [t / 1e9 for t in times], [0] * n, Workload([[5, 6, 7]], [1])))
    times, _ = server_schedule(2 * load / step_s, RUN["schedule_rng_seed"], 0, n)
    stretches = []
    pooled = run(Layout([one, one]), [t / 1e9 for t in times], [0] * n, Workload([[5, 6, 7]], [1]), stretches)
    ttft, _ = latencies_ns(pooled)
    assert sum(ttft) <= sum(alone)
    # Two steps at once: the in-flight average exceeds what one replica could hold at this load.
    span = sum(seconds for seconds, _ in stretches)
    assert sum(seconds * count for seconds, count in stretches) / span > load


def test_a_disaggregated_query_pays_its_prefill_its_handoff_and_its_decodes():
    """One query alone through a prefill worker and a decode worker: its first token after the
    prefill step, then the handoff (per KV block of its prompt), then a decode step per token."""
    from harness.predict.simulate import Layout, Workload, run

    step_s, handoff = 0.010, 0.002
    prompt, tokens = [7] * 10, 5  # 3 blocks of 4
    layout = Layout([constant_cost_engine(step_s)], [constant_cost_engine(step_s)], handoff)
    [(arrival, _, first, end, emitted)] = run(layout, [1.0], [0], Workload([prompt], [tokens]))
    assert first - arrival == pytest.approx(step_s)
    assert end - first == pytest.approx(3 * handoff + (tokens - 1) * step_s)
    assert emitted == tokens


@pytest.mark.parametrize("acceptance, steps", [([1.0, 1.0], 4), ([0.0, 0.0], 12)])
def test_speculation_emits_the_accepted_drafts_and_one_token_per_verification(acceptance, steps):
    """k = 2 drafts: all accepted, 3 tokens per decode step; none, one; a 13-token answer after its
    first token takes 12 / 3 or 12 steps. Its length is the answer's either way (the verifier is exact)."""
    from harness.predict.simulate import Workload, run
    from sut.config.speculative import SpeculativeConfig

    engine = constant_cost_engine(0.01, acceptance=acceptance, speculative_config=SpeculativeConfig("ngram", 2))
    [(arrival, _, first, end, emitted)] = run(engine, [0.0], [0], Workload([[5, 6, 7, 8]], [13]))
    assert emitted == 13 and end - first == pytest.approx(steps * 0.01)


def test_speculation_accepts_at_the_measured_rate():
    """One draft accepted with probability 0.6: 1.6 tokens per verification on average."""
    from harness.predict.simulate import Workload, run
    from sut.config.speculative import SpeculativeConfig

    engine = constant_cost_engine(0.01, 8, [0.6], speculative_config=SpeculativeConfig("ngram", 1))
    queries = run(engine, [0.0] * 8, list(range(8)), Workload([[5, 6, 7, i] for i in range(8)], [61] * 8))
    # 8 at once, each decoding at every step: its steps after the first token, one verification each
    verifications = sum(round((end - first) / 0.01) for _, _, first, end, _ in queries)
    assert 8 * 60 / verifications == pytest.approx(1.6, rel=0.05)


def test_acceptance_by_position_is_conditional_on_the_drafts_before():
    from sut.engine.profile import acceptance_by_position

    stats = {"num_proposals": 10, "acceptance_by_position": [0.8, 0.4, 0.0]}
    assert acceptance_by_position(stats) == pytest.approx([0.8, 0.5, 0.0])
    assert acceptance_by_position(None) == [] and acceptance_by_position({"num_proposals": 0}) == []


def test_every_layout_is_simulated_with_its_workers_settings():
    """One engine, replicas (each its own KV pool), disaggregated workers (the prefill side without
    speculation); something else is refused by name."""
    from types import SimpleNamespace

    from harness.predict.predictor import PredictError, simulated_layout
    from sut.config import EngineConfig
    from sut.config.speculative import SpeculativeConfig

    costs = constant_cost_engine(0.01).costs
    costs.acceptance, costs.transfer_s_per_block = [0.7], 0.003
    plain = simulated_layout(SimpleNamespace(config=EngineConfig(), runner=SimpleNamespace(num_blocks=99)), costs, 64)
    assert [e.num_blocks for e in plain.workers] == [99] and plain.workers[0].max_tokens == 64
    replicas = simulated_layout(SimpleNamespace(config=EngineConfig(data_parallel_size=2), num_blocks=[5, 6]), costs, 9)
    assert [e.num_blocks for e in replicas.workers] == [5, 6] and not replicas.decode
    assert all(e.config.data_parallel_size == 1 for e in replicas.workers)
    spec = SpeculativeConfig("ngram", 2)
    split = EngineConfig(disaggregation={"prefill": 1, "decode": 2}, speculative_config=spec)
    pools = simulated_layout(SimpleNamespace(config=split, num_blocks=[4, 5, 6], num_prefill=1), costs, 9)
    assert [e.num_blocks for e in pools.workers] == [4] and [e.num_blocks for e in pools.decode] == [5, 6]
    assert pools.workers[0].config.speculative_config is None and pools.decode[0].acceptance == [0.7]
    assert pools.transfer_s_per_block == 0.003
    with pytest.raises(PredictError, match="not an engine"):
        simulated_layout(SimpleNamespace(config=EngineConfig()), costs, 64)


def test_the_chain_starts_at_the_prediction_re_anchored_on_its_latest_runs(tmp_path, monkeypatch):
    """`calibrate --reanchor-on`: the search's first rate is the capacity simulated with the steps
    costing what the latest runs' steps cost against the model (here twice: about half the
    capacity at half the limits, as above); the chain gives Server's trials' and performance run's
    for Interactive, none for Server."""
    import harness.measure.calibrate as calibrate
    from compliance.loadgen_logs import STEPS_FILE
    from harness.predict.predictor import Prediction
    from harness.predict.simulate import Layout, Workload, capacity
    from harness.run import write_steps
    from harness.submission import latest_steps

    engine = constant_cost_engine(0.010)
    workload = Workload([[5, 6, 7]], [1])
    schedule = {"schedule_rng_seed": RUN["schedule_rng_seed"], "sample_index_rng_seed": 1}
    schedule |= {"min_duration_ms": 0, "min_query_count": 2000, "limits_ms": (40.0, 100.0)}
    qps, _ = capacity(Layout([engine]), workload, schedule, schedule["limits_ms"], 10.0)
    halved, _ = capacity(Layout([engine]), workload, schedule, (20.0, 50.0), 10.0)
    prediction = Prediction(qps, qps, qps, engine.costs, 1, (Layout([engine]), workload, schedule))
    monkeypatch.setattr(calibrate, "predict_engine", lambda *args, **kwargs: prediction)

    logs = tmp_path / "llama3.1-8b"
    shape = {"step": 1.0, "prefill_token": 3.0, "decode_token": 0.0, "draft_token": 0.0, "attention": 6.0}
    for run in ("Offline/performance", "Server/calibration/capacity/01-9.0qps", "Server/performance"):
        (logs / run).mkdir(parents=True)
        write_steps(logs / run / STEPS_FILE, [(shape, 0.020)] * 50)
    assert latest_steps(logs / "Server", "Server") == []
    interactive = latest_steps(logs / "Interactive", "Interactive")
    assert interactive == [
        logs / run / STEPS_FILE for run in ("Server/calibration/capacity/01-9.0qps", "Server/performance")
    ]

    cal = calibrate.Calibration("Interactive", 500, 30, 1.0, 1.0)
    calibrate.predict_capacity(cal, None, SimpleNamespace(scenario="Interactive"), None, tmp_path, interactive)
    assert cal.predicted_qps == pytest.approx(qps, rel=1e-3)
    assert cal.predicted_start_qps == cal.reanchored_qps == pytest.approx(halved / 2, rel=0.03)
    assert "re-anchored on the 100 steps of this machine's latest runs (2.00x the model's, median)" in cal.predicted
    cal = calibrate.Calibration("Interactive", 500, 30, 1.0, 1.0)  # nothing to re-anchor on: the band's low end
    calibrate.predict_capacity(cal, None, SimpleNamespace(scenario="Interactive"), None, tmp_path, [])
    assert cal.predicted_start_qps == pytest.approx(qps, rel=1e-3) and cal.reanchored_qps is None
