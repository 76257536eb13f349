"""A LoadGen run re-simulated with its own step costs (harness/measure/resimulate.py): a run whose
every step the simulator itself took, slow stretch and all, is reproduced to the microsecond, and
the same queries at the median step cost lose the tail the stretch made."""

import json
import random

import pytest

from compliance.loadgen_logs import MLLOG_MARKER
from compliance.run_folder import RunFolder
from harness.measure.resimulate import ResimulateError, resimulate
from harness.predict.simulate import Engine, Workload, latencies_ns, run
from harness.predict.step_costs import StepCostModel
from harness.predict.verdict import server_result
from harness.run import write_steps
from sut.config.engine import EngineConfig

SETTINGS = {"max_num_batched_tokens": 256, "tpot_target_ms": 26}
LIMITS_NS = (500_000_000, 30_000_000)
COSTS = StepCostModel(
    {"step": 4e-3, "prefill_token": 3e-4, "decode_token": 2e-4, "draft_token": 0.0, "attention": 2e-8}, 0.0, 0.0, 0
)


def mllog(key, value):
    return f"{MLLOG_MARKER} " + json.dumps({"key": key, "value": value, "metadata": {"is_error": False}})


def write_run(folder, dataset, queries, samples, steps, result, rate):
    """A Server run's folder as LoadGen and the harness write it: detail log, trace, responses,
    run.json and steps.json."""
    writer = RunFolder(folder)
    writer.open({"scenario": "Interactive"})
    detail = {
        "effective_scenario": "Server",
        "effective_target_qps": rate,
        "requested_server_ttft_latency": LIMITS_NS[0],
        "requested_server_tpot_latency": LIMITS_NS[1],
        **result,
    }
    (folder / "mlperf_log_detail.txt").write_text("\n".join(mllog(k, v) for k, v in detail.items()) + "\n")
    ttft, _ = latencies_ns(queries)
    trace, responses = ['{"traceEvents":['], []
    for seq, ((arrival, _, first, end, tokens), sample) in enumerate(zip(queries, samples)):
        ts, latency = f"{1000 + arrival * 1e6:.3f}", int((end - arrival) * 1e9)
        trace.append(
            f'{{"name":"Token_Latency","ph": "C","pid":1,"ts":{ts},"args":{{ "issue_delay":0,'
            f'"issue_to_done":{ttft[seq]}}}}},'
        )
        trace.append(
            f'{{"name":"Sample","cat":"default","ph":"b","pid":1,"id":{seq},"ts":{ts},"args":{{"sample_seq":{seq},'
            f'"query_seq":{seq},"sample_idx":{sample},"issue_start_ns":0,"complete_ns":{latency}}}}},'
        )
        responses.append({"seq_id": seq, "qsl_idx": sample, "data": "05000000" * tokens, "token_count": tokens})
    (folder / "mlperf_log_trace.json").write_text("\n".join(trace) + "\n")
    (folder / "mlperf_log_accuracy.json").write_text(json.dumps(responses))
    record = {"system": "cpu-demo", "benchmark": "llama3.1-8b", "engine": SETTINGS, "dataset": str(dataset)}
    (folder / "run.json").write_text(json.dumps(record))
    if steps is not None:
        write_steps(folder / "steps.json", steps)
    writer.complete("simulated")
    return folder


def test_a_run_the_simulator_took_is_reproduced_slow_stretch_and_all(tmp_path):
    rng = random.Random(3)
    prompts = [[9] * rng.randint(30, 128) for _ in range(20)]
    answers = [rng.randint(2, 40) for _ in prompts]
    dataset = tmp_path / "data.json"
    dataset.write_text(json.dumps([{"tok_input": p, "output": "x"} for p in prompts]))
    rate, count = 3.0, 460
    arrivals, t = [], 0.0
    for _ in range(count):
        t += rng.expovariate(rate)
        arrivals.append(t)
    samples = [rng.randrange(len(prompts)) for _ in range(count)]
    # The machine slows 4x for a stretch of 300 steps mid-run, as a shared one does.
    ratios = [4.0 if 2000 <= i < 2300 else rng.uniform(0.9, 1.1) for i in range(100_000)]
    engine = Engine(EngineConfig.from_kwargs(**SETTINGS), 100_000, COSTS, 128, 1.0, [], ratios, True)
    steps = []
    queries = run(engine, arrivals, samples, Workload(prompts, answers), steps=steps)
    ttft, tpot = latencies_ns(queries)
    result = server_result(ttft, tpot, *LIMITS_NS)
    assert result["result_validity"] == "INVALID"  # the stretch made first tokens late
    folder = write_run(tmp_path / "run", dataset, queries, samples, steps, result, rate)

    again = resimulate(folder)
    for key in ("result_first_token_99.00_percentile_latency_ns", "result_time_per_output_token_99.00_percentile_ns"):
        assert again.in_order[key] == pytest.approx(result[key], abs=2_000)  # 2 us: the logs' rounding
    assert again.in_order["result_validity"] == "INVALID"
    # Every step at the median ratio: the stretch's tail is gone.
    assert again.at_median["result_validity"] == "VALID"
    assert again.median_ratio == pytest.approx(1.0, abs=0.02)
    assert "INVALID" in again.lines("run")[1] and "VALID" in again.lines("run")[2]


def test_a_run_that_logged_no_steps_is_refused_by_name(tmp_path):
    dataset = tmp_path / "data.json"
    dataset.write_text(json.dumps([{"tok_input": [9] * 40, "output": "x"}]))
    engine = Engine(EngineConfig.from_kwargs(**SETTINGS), 1000, COSTS, 128)
    queries = run(engine, [0.0, 0.5], [0, 0], Workload([[9] * 40], [5]))
    ttft, tpot = latencies_ns(queries)
    result = server_result(ttft, tpot, *LIMITS_NS)
    folder = write_run(tmp_path / "run", dataset, queries, [0, 0], None, result, 2.0)
    with pytest.raises(ResimulateError, match="steps.json: not found"):
        resimulate(folder)
