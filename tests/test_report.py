"""The measurement report (harness/measure/report.py): goodput and cost on a hand-built log whose answers are
known; then the whole ablation on a tiny model, every figure on its page recomputed here from the
LoadGen logs it cites, and the page rendered by headless Chromium."""

import html
import html.parser
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from accuracy.report import summarization_accuracy
from compliance.loadgen_logs import MLLOG_MARKER
from compliance.run_folder import STATUS_FILE, RunFolder
from harness.measure.report import build, cost_per_million, figures_for, placement, verdict
from harness.measure.run_logs import RunLogError, loadgen_percentile, read_run
from systems.benchmarks import BENCHMARKS, loadgen_double
from systems.schema import REPO
from tests.helpers import tiny_model_and_dataset
from tests.tiny_system import one_thread

# ---- a hand-built run ---------------------------------------------------------------------------

# (TTFT ms, end-to-end ms, tokens) per query, against targets of 2000 ms and 100 ms.
HAND_QUERIES = [
    (100, 1100, 11),  # TPOT exactly 100: meets it
    (2500, 3000, 3),  # TTFT over
    (500, 2000, 11),  # TPOT 150: over
    (2000, 2200, 5),  # TTFT exactly 2000, TPOT 50: meets both
    (300, 300, 1),  # one token: no TPOT, meets it
]
HAND_PROMPTS = [[7] * n for n in (10, 20, 30, 40, 50)]


def mllog(key, value):
    return MLLOG_MARKER + " " + json.dumps({"key": key, "value": value, "metadata": {"is_error": False}})


def write_hand_run(folder, queries=HAND_QUERIES, busy=(1.0, 3.0), edit=None):
    """A Server run's folder written by hand through the harness's writer, marked complete after
    `edit(folder)`."""
    writer = RunFolder(folder)
    writer.open({"scenario": "Server"})
    detail = [
        mllog("effective_scenario", "Server"),
        mllog("result_query_count", len(queries)),
        mllog("result_completed_samples_per_sec", 0.5),
        mllog("result_completed_tokens_per_second", 3.1),
    ]
    for p in ("50.00", "99.00"):
        detail += [
            mllog(f"result_first_token_{p}_percentile_latency_ns", 1),
            mllog(f"result_time_per_output_token_{p}_percentile_ns", 1),
        ]
    (folder / "mlperf_log_detail.txt").write_text("\n".join(detail) + "\n")
    trace = [
        '{"traceEvents":[',
        '{"name":"LogDetail","ph":"X","pid":1,"tid":2,"ts":1.0,"dur":1.0,"args":{"key":""x""}},',
    ]
    accuracy = []
    for seq, (ttft, e2e, tokens) in enumerate(queries):
        ts = f"{1000.5 + 2e6 * seq:.3f}"
        # Times from the scheduled one, as LoadGen logs them: issued 5 ns late.
        trace.append(
            f'{{"name":"Token_Latency","ph": "C","pid":1,"ts":{ts},"args":{{ "issue_delay":5,'
            f'"issue_to_done":{ttft * 10**6 - 5}}}}},'
        )
        trace.append(
            f'{{"name":"Sample","cat":"default","ph":"b","pid":1,"id":{seq},"ts":{ts},"args":{{"sample_seq":{seq},'
            f'"query_seq":{seq},"sample_idx":{seq},"issue_start_ns":5,"complete_ns":{e2e * 10**6}}}}},'
        )
        accuracy.append(
            {
                "seq_id": seq,
                "qsl_idx": seq,
                "data": "03000000" * tokens,
                "token_data": "03000000",
                "token_count": tokens,
            }
        )
    (folder / "mlperf_log_trace.json").write_text("\n".join(trace) + "\n")
    (folder / "mlperf_log_accuracy.json").write_text(json.dumps(accuracy))
    (folder / "run.json").write_text(json.dumps({"busy_s": {"prefill_s": busy[0], "decode_s": busy[1]}}))
    if edit is not None:
        edit(folder)
    writer.complete("hand-made")
    return folder


def test_goodput_counts_exactly_the_queries_under_both_targets(tmp_path):
    run = read_run(write_hand_run(tmp_path / "run"))
    assert [(q.ttft_ns, q.latency_ns, q.num_tokens) for q in run.queries] == [
        (t * 10**6, e * 10**6, n) for t, e, n in HAND_QUERIES
    ]
    assert run.duration_s == 10.0  # 5 queries at 0.5 per second
    assert run.goodput(2000, 100) == (3, 0.3)
    assert run.goodput(2000, 99.9) == (2, 0.2)  # the first query's TPOT of 100 ms is now over
    assert run.goodput(5000, 1000) == (5, 0.5)


def test_cost_per_million_tokens_follows_the_stated_formula(tmp_path):
    # 3.6 per hour for 10 s is 0.01; a quarter of the busy time was prefill.
    share, per_input, per_output = cost_per_million(3.6, 10.0, {"prefill_s": 1.0, "decode_s": 3.0}, 150, 31)
    assert share == 0.25
    assert per_input == pytest.approx(0.01 * 0.25 / 150 * 1e6)
    assert per_output == pytest.approx(0.01 * 0.75 / 31 * 1e6)
    assert cost_per_million(3.6, 10.0, {"prefill_s": 1.0, "decode_s": 3.0}, 0, 0)[1:] == (None, None)
    # Only the tokens of the queries within both targets count: the first, fourth and fifth.
    run = read_run(write_hand_run(tmp_path / "run"))
    fig = figures_for(run, "hand", (2000, 100), 3.6, HAND_PROMPTS)
    assert (fig.input_tokens, fig.output_tokens) == (10 + 40 + 50, 11 + 5 + 1)
    assert fig.cost_per_m_input == pytest.approx(0.01 * 0.25 / 100 * 1e6)
    assert fig.cost_per_m_output == pytest.approx(0.01 * 0.75 / 17 * 1e6)


def test_a_trace_missing_a_first_token_is_refused_by_name(tmp_path):
    def drop_a_first_token(folder):
        trace = folder / "mlperf_log_trace.json"
        trace.write_text(
            "\n".join(
                line for line in trace.read_text().splitlines() if '"ts":1000.500,' not in line or "Sample" in line
            )
            + "\n"
        )

    folder = write_hand_run(tmp_path / "run", edit=drop_a_first_token)
    with pytest.raises(RunLogError, match="1 queries have no first-token event"):
        read_run(folder)


@pytest.mark.parametrize("state", ["killed", "failed", "changed"])
def test_a_run_that_did_not_complete_is_refused_by_name(tmp_path, state):
    folder = write_hand_run(tmp_path / "run")
    status = json.loads((folder / STATUS_FILE).read_text())
    if state == "changed":
        (folder / "mlperf_log_accuracy.json").write_text("[]")
        expected = "mlperf_log_accuracy.json: changed since its run completed"
    else:
        status.update({"killed": {"status": "running"}, "failed": {"status": "failed", "reason": "boom"}}[state])
        (folder / STATUS_FILE).write_text(json.dumps(status))
        expected = {
            "killed": "holds no complete run: its run .* never finished: it was killed or crashed",
            "failed": "holds no complete run: its run failed: boom",
        }[state]
    with pytest.raises(RunLogError, match=expected):
        read_run(folder)


# ---- the ablation on a tiny model ---------------------------------------------------------------

SAMPLES = 12
TARGETS = BENCHMARKS["llama3.1-8b"].latency_limits_ms["Server"]
PRICE = 1.5


@pytest.fixture(scope="module")
def report_run(tiny_llama, tmp_path_factory):
    root = tmp_path_factory.mktemp("report-repo")
    model_dir, prompts, _, dataset = tiny_model_and_dataset(tiny_llama[0], root, 16, seed=11)
    system = {
        "division": "open",
        "saaf_harness": {
            "model": str(model_dir),
            "datasets": {"llama3.1-8b": str(dataset)},
            "engine": {"num_kv_blocks": 1024},
            "scenarios": ["Server"],
            "demo": True,
            "report": {
                "samples": SAMPLES,
                "max_trials": 2,
                "proposers": [{"method": "ngram", "num_speculative_tokens": 2}],
                "layouts": [{"name": "disaggregated", "engine": {"disaggregation": {"prefill": 1, "decode": 1}}}],
                "price_per_hour": PRICE,
                "profile_s": 5,
            },
        },
    }
    (root / "systems").mkdir()
    (root / "systems" / "tiny.json").write_text(json.dumps(system))
    out = root / "report"
    done = subprocess.run(
        [sys.executable, "-m", "harness.measure.report", "--system", "tiny", "--root", str(root), "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=one_thread(),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return root, out, prompts, done.stdout


class Tables(html.parser.HTMLParser):
    """Each <table id=...> of a page as its rows of cell texts (header row first)."""

    def __init__(self, text):
        super().__init__()
        self.tables, self._table, self._row = {}, None, None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self._table = self.tables.setdefault(dict(attrs).get("id", f"table{len(self.tables)}"), [])
        elif tag == "tr" and self._table is not None:
            self._row = []
            self._table.append(self._row)
        elif tag in ("td", "th") and self._row is not None:
            self._row.append("")

    def handle_endtag(self, tag):
        if tag == "table":
            self._table = self._row = None
        elif tag == "tr":
            self._row = None

    def handle_data(self, data):
        if self._row:
            self._row[-1] += data


def independent_queries(folder):
    """Per query (TTFT ns, latency ns, tokens, qsl_idx, token ids) from LoadGen's trace and accuracy
    log, parsed here line by line with json (each event line is JSON by itself); times from the
    scheduled one, as LoadGen counts them."""
    samples, first = {}, {}
    for line in (folder / "mlperf_log_trace.json").read_text().splitlines():
        if line.startswith('{"name":"Sample","cat":"default","ph":"b"') or line.startswith('{"name":"Token_Latency"'):
            event = json.loads(line.rstrip(","))
            if event["name"] == "Sample":
                samples[event["ts"]] = event["args"]
            else:
                first[event["ts"]] = event["args"]["issue_delay"] + event["args"]["issue_to_done"]
    responses = {e["seq_id"]: e for e in json.loads((folder / "mlperf_log_accuracy.json").read_text())}
    out = []
    for ts, args in samples.items():
        entry = responses[args["sample_seq"]]
        ids = [
            int.from_bytes(bytes.fromhex(entry["data"][i : i + 8]), "little") for i in range(0, len(entry["data"]), 8)
        ]
        out.append((first[ts], args["complete_ns"], entry["token_count"], args["sample_idx"], ids))
    return out


def detail(folder):
    values = {}
    for line in (folder / "mlperf_log_detail.txt").read_text().splitlines():
        if line.startswith(MLLOG_MARKER):
            entry = json.loads(line[len(MLLOG_MARKER) :])
            values.setdefault(entry["key"], entry["value"])
    return values


def trial_rows(table, label):
    return [row for row in table[1:] if row[0] == label and row[1]]


def test_every_figure_on_the_page_is_recomputed_from_the_logs_it_cites(report_run):
    from transformers import AutoTokenizer

    root, out, prompts, stdout = report_run
    runs = out / "runs"
    plan = json.loads((runs / "ablation.json").read_text())
    labels = [c["label"] for c in plan["configs"]]
    assert labels == [
        "static batching",
        "continuous batching",
        "chunked prefill",
        "n-gram speculation",
        "disaggregated",
    ]
    assert re.search(rf"^report: \[1/5\] static batching: Offline, {SAMPLES} samples", stdout, re.MULTILINE)
    tables = Tables((out / "report.html").read_text()).tables
    headline, searches, cost_table, by_tpot = (
        tables["headline"],
        tables["searches"],
        tables["cost"],
        tables["tpot_targets"],
    )
    assert [row[0] for row in headline[1:]] == labels
    tokenizer = AutoTokenizer.from_pretrained(root / "tiny-llama")
    references = [r["output"] for r in json.loads((root / "data.json").read_text())]
    responses_by_config, base, unmeasured = [], None, []
    for config, row in zip(plan["configs"], headline[1:]):
        folder = runs / config["folder"]
        # Offline: every sample once, its tokens/s LoadGen's, its quality from its own responses.
        offline = detail(folder / "offline")
        entries = json.loads((folder / "offline" / "mlperf_log_accuracy.json").read_text())
        assert sorted(e["qsl_idx"] for e in entries) == list(range(SAMPLES)) == sorted({e["qsl_idx"] for e in entries})
        responses = {
            e["qsl_idx"]: [
                int.from_bytes(bytes.fromhex(e["data"][i : i + 8]), "little") for i in range(0, len(e["data"]), 8)
            ]
            for e in entries
        }
        responses_by_config.append(responses)
        order = sorted(responses)
        scores = summarization_accuracy(
            tokenizer.batch_decode([responses[i] for i in order], skip_special_tokens=True),
            [references[i] for i in order],
            [len(responses[i]) for i in order],
        )
        assert row[11].split(" ")[0] == f"{scores['rouge1']:.4f}"
        # The search: each trial's verdict is LoadGen's p99 check in its own detail log, the capacity
        # the highest rate that passed.
        search = json.loads((folder / "capacity.json").read_text())
        assert search["start_qps"] == pytest.approx(0.7 * offline["result_samples_per_second"])
        passed = []
        for trial in search["trials"]:
            d = detail(runs / trial["logs"])
            assert trial["passed"] == d["result_perf_constraints_met"]
            assert d["result_query_count"] == min(SAMPLES, max(40, round(trial["qps"] * 40)))
            assert d["effective_target_qps"] == trial["qps"]  # the rate as LoadGen logs it
            if trial["passed"]:
                passed.append((trial["qps"], runs / trial["logs"]))
        # Goodput well below capacity: one trial at half of it (of the lowest failure where none
        # passed), in the searches table beside the search's own.
        low = search["low_load"]
        assert low is not None, search["low_load_not_run"]
        assert low["qps"] == loadgen_double(0.5 * (search["capacity_qps"] or search["failed_qps"]), 4)
        assert detail(runs / low["logs"])["effective_target_qps"] == low["qps"]
        assert low["passed"] == detail(runs / low["logs"])["result_perf_constraints_met"]
        assert len(search["trials"]) == 2
        rates = [float(row[1]) for row in trial_rows(searches, config["label"])]
        assert rates == pytest.approx(sorted(t["qps"] for t in [*search["trials"], low]), abs=1e-3), rates
        if not passed:  # two short trials on a busy machine can both fail: the page says so
            assert search["capacity_qps"] is None and row[4] == "none" and row[9] == row[10] == "n/a"
            unmeasured.append(config["label"])
            base = base or False  # the ratios are against the first configuration, here without one
            continue
        capacity, at = max(passed)
        assert search["capacity_qps"] == capacity
        d, queries = detail(at), independent_queries(at)
        assert len(queries) == d["result_query_count"]
        assert sorted(q[3] for q in queries) == sorted(set(q[3] for q in queries))  # each sample at most once
        ttft, e2e = [q[0] for q in queries], [q[1] for q in queries]
        tpot = [(b - a) / (n - 1) for a, b, n, *_ in queries if n > 1]
        # LoadGen's percentiles from these per-query values: the trace's pairing is LoadGen's own.
        for p, key in ((0.5, "50.00"), (0.99, "99.00")):
            assert loadgen_percentile(ttft, p) == d[f"result_first_token_{key}_percentile_latency_ns"]
            assert loadgen_percentile(e2e, p) == d[f"result_{key}_percentile_latency_ns"]
            assert loadgen_percentile(tpot, p) == pytest.approx(
                d[f"result_time_per_output_token_{key}_percentile_ns"], rel=1e-6, abs=1
            )
        ms = lambda key: d[key] / 1e6  # noqa: E731
        assert row[3].split(" ")[0] == f"{offline['result_tokens_per_second']:.1f}"
        assert row[4].startswith(f"{capacity:.3f}")
        assert row[5] == f"{d['result_completed_tokens_per_second']:.1f}"
        assert (
            row[6] == f"{ms('result_first_token_50.00_percentile_latency_ns'):.0f} / "
            f"{ms('result_first_token_99.00_percentile_latency_ns'):.0f}"
        )
        assert (
            row[7] == f"{ms('result_time_per_output_token_50.00_percentile_ns'):.1f} / "
            f"{ms('result_time_per_output_token_99.00_percentile_ns'):.1f}"
        )
        duration = d["result_query_count"] / d["result_completed_samples_per_sec"]
        within = [
            q
            for q in queries
            if q[0] <= TARGETS[0] * 1e6 and (q[2] < 2 or (q[1] - q[0]) / (q[2] - 1) <= TARGETS[1] * 1e6)
        ]
        assert row[8] == f"{len(within) / duration:.3f} ({len(within)}/{len(queries)})"
        busy = json.loads((at / "run.json").read_text())["busy_s"]
        share = busy["prefill_s"] / (busy["prefill_s"] + busy["decode_s"])
        cost = PRICE * duration / 3600
        inputs, outputs = sum(len(prompts[q[3]]) for q in within), sum(q[2] for q in within)
        per_input, per_output = cost * share / inputs * 1e6, cost * (1 - share) / outputs * 1e6
        assert row[9].split(" ")[0] == f"{per_input:.4f}" and row[10].split(" ")[0] == f"{per_output:.4f}"
        cost_row = next(r for r in cost_table if r[0] == config["label"])
        assert cost_row[2:5] == [str(inputs), str(outputs), f"{share:.3f}"]
        tpot_row = next(r for r in by_tpot if r[0] == config["label"])
        # The rate as the run's LoadGen log gives it (its user.conf's, to 4 decimals).
        at_rate = d["effective_target_qps"]
        assert tpot_row[by_tpot[0].index("TPOT <= 100 ms")] == f"{per_output:.4f} at {at_rate:.3f} q/s"
        # Ratios against static batching, the first configuration.
        if base is None:
            base = (capacity, offline["result_tokens_per_second"], per_output)
            assert row[12] == "the baseline"
        elif base:
            assert f"({capacity / base[0]:.2f}x)" in row[4]
            assert row[3].endswith(f"({offline['result_tokens_per_second'] / base[1]:.2f}x)")
            assert row[10].endswith(f"({per_output / base[2]:.2f}x)")
            assert row[12].startswith(("wins: ", "LOSES: ", "undecided: "))
        # The prediction beside the measurement: the capacity the simulation found, its band and the
        # measured capacity against it; the verdict says what the prediction says, as a prediction.
        predicted = json.loads((folder / "capacity.json").read_text())["predicted"]
        assert predicted["qps"] > 0 and predicted["low"] <= predicted["qps"] <= predicted["high"], predicted
        assert row[13].startswith(f"{predicted['qps']:.3f} ({predicted['low']:.3f}-{predicted['high']:.3f}")
        if capacity:
            assert f"; measured {capacity / predicted['qps'] - 1:+.0%}" in row[13]
        # Re-anchored on the first trial's own steps (a single engine logs them; a pool's are in its
        # processes), as the chain's search does.
        again = predicted.get("reanchored")
        assert (again is not None) == ("disaggregated" not in config["label"]), predicted
        if again and again["qps"]:
            assert again["on_trial_qps"] == search["trials"][0]["qps"] and again["median_ratio"] > 0
            assert f"re-anchored on its first trial {again['qps']:.3f}" in row[13]
            if capacity:
                assert row[13].endswith(f", measured {capacity / again['qps'] - 1:+.0%})")
        if config["builds_on"]:
            assert "; predicted: it " in row[12]
        # A disaggregated layout: which placement the predictions pick (DistServe's question).
        assert ("; placement: the prediction picks " in row[12]) == ("disaggregated" in config["label"])
    assert len(unmeasured) < len(labels), f"no configuration passed a trial: {unmeasured}"
    # Greedy decoding, speculation exact: every configuration gave the same tokens, so the same quality.
    assert all(r == responses_by_config[0] for r in responses_by_config)
    assert all(row[11].endswith("(+0.00%)") for row in headline[1:])
    md = (out / "report.md").read_text()
    assert "| " + " | ".join(headline[1]) + " |" in md  # the same tables in the Markdown
    # The page opens with the capacity chart and a line per configuration; the method comes last.
    assert md.index("![capacity](capacity.png)") < md.index("## Conditions") < md.index("## How each figure")
    assert md.rstrip().endswith(json.loads((out / "report.json").read_text())["method"].rstrip())
    for label in labels[1:]:
        assert f"- **{label}**: " in md
    assert "TTFT 2000 ms, TPOT 100 ms" in md and "1.5 per hour" in md


def test_the_placement_picked_is_the_higher_predicted_capacity_with_the_measured_beside_it():
    colocated = {"label": "int16", "predicted": {"qps": 13.3}, "capacity_qps": 13.4}
    split = {
        "label": "disaggregated",
        "engine": {"disaggregation": {"prefill": 1, "decode": 1}},
        "predicted": {"qps": 9.4},
        "capacity_qps": 8.5,
    }
    said = placement(split, colocated)
    assert said.startswith("placement: the prediction picks colocated (int16) (9.400 QPS for 1 prefill + 1 decode")
    assert said.endswith("against 13.300 colocated; measured 8.500 against 13.400)")
    faster = placement({**split, "predicted": {"qps": 20.0}, "capacity_qps": None}, colocated)
    assert faster.startswith("placement: the prediction picks 1 prefill + 1 decode workers (20.000 QPS")
    assert faster.endswith("not both measured)")
    assert placement(colocated, split) == "" and placement(split, None) == ""
    assert placement(split, {**colocated, "predicted": {"qps": None}}) == ""


def test_a_configuration_that_costs_capacity_is_named_a_loser():
    # Each capacity with the rate that failed above it: only brackets apart decide.
    base = {
        "label": "chunked",
        "capacity_qps": 4.0,
        "failed_qps": 4.4,
        "search_summary": "",
        "meets_quality_target": True,
    }
    slower = {**base, "label": "draft", "capacity_qps": 1.0, "failed_qps": 1.1}
    assert verdict(slower, base) == "LOSES: 0.25x the capacity of chunked"
    assert verdict({**slower, "capacity_qps": 6.0, "failed_qps": None}, base) == "wins: 1.50x the capacity of chunked"
    assert verdict({**slower, "capacity_qps": 4.4, "failed_qps": 5.0}, base) == "wins: 1.10x the capacity of chunked"
    assert verdict({**slower, "capacity_qps": 3.6, "failed_qps": 4.0}, base) == "LOSES: 0.90x the capacity of chunked"
    assert verdict({**slower, "capacity_qps": 3.6, "failed_qps": 4.2}, base).startswith(
        "undecided: 0.90x the capacity of chunked, but the searches' brackets overlap (3.600-4.200 against 4.000-4.400"
    )
    assert verdict({**slower, "capacity_qps": 4.2, "failed_qps": None}, base).startswith("undecided: 1.05x")
    none = {**slower, "capacity_qps": None, "failed_qps": 0.1, "search_summary": "no rate passed down to 0.100 QPS"}
    assert verdict(none, base) == "LOSES: no rate met the targets (no rate passed down to 0.100 QPS)"
    assert verdict({**none, "failed_qps": 4.5}, base).startswith(
        "undecided: no rate met the targets down to 4.500 QPS, above the capacity of chunked (4.000)"
    )
    assert verdict(none, None).startswith("no rate met the targets") and verdict(base, None) == "the baseline"
    # With the machine's run-to-run spread (report.capacity_spread), brackets must be that far apart.
    assert verdict({**slower, "capacity_qps": 4.4, "failed_qps": 5.0}, base, 0.3).startswith(
        "undecided: 1.10x the capacity of chunked, within the run-to-run spread of 30%"
    )
    assert (
        verdict({**slower, "capacity_qps": 5.8, "failed_qps": 6.0}, base, 0.3) == "wins: 1.45x the capacity of chunked"
    )
    assert verdict({**slower, "capacity_qps": 2.9, "failed_qps": 3.2}, base, 0.3).startswith("undecided: 0.72x")
    assert (
        verdict({**slower, "capacity_qps": 2.9, "failed_qps": 3.0}, base, 0.3) == "LOSES: 0.72x the capacity of chunked"
    )
    assert verdict({**none, "failed_qps": 3.5}, base, 0.3).startswith(
        "undecided: no rate met the targets down to 3.500"
    )
    assert verdict(none, base, 0.3).startswith("LOSES: no rate met the targets")
    worse = {**slower, "capacity_qps": 6.0, "meets_quality_target": False}
    assert verdict(worse, base).endswith("quality under 99% of the first configuration's")


def test_the_page_is_rebuilt_from_existing_runs(report_run, tmp_path):
    _, out, _, _ = report_run
    logs = tmp_path / "logs"
    trial = json.loads((out / "runs" / "03-chunked" / "capacity.json").read_text())["trials"][0]["logs"]
    for name in ("03-chunked/offline", trial):  # a submission's folders: no plan beside them
        shutil.copytree(out / "runs" / name, logs / name)
    report = build([logs], tmp_path / "page", price=PRICE)
    assert report["configurations"] == [] and [f["label"] for f in report["figures"]] == sorted(
        ["03-chunked/offline", trial]
    )
    first = {f["folder"]: f for f in json.loads((out / "report.json").read_text())["figures"]}
    for f in report["figures"]:
        again = first[str(out / "runs" / f["label"])]
        for key in (
            "tokens_per_s",
            "ttft_p99_ms",
            "tpot_p99_ms",
            "goodput_qps",
            "cost_per_m_input",
            "cost_per_m_output",
        ):
            assert again[key] == f[key], key
    assert (tmp_path / "page" / "report.html").is_file()


def test_a_rate_run_twice_is_shown_by_its_run_that_met_the_targets(report_run, tmp_path):
    # A search that retried its bracket's top (harness/measure/capacity.py retries) may hold a failed and a
    # passing run at the capacity: the page's figures at the capacity are the passing run's.
    _, out, _, _ = report_run
    runs = tmp_path / "runs"
    shutil.copytree(out / "runs", runs)
    # A configuration with a capacity: which have one depends on the machine (two short trials on
    # a busy one can both fail, static batching's most often).
    configs = json.loads((out / "report.json").read_text())["configurations"]
    n = next((i for i, c in enumerate(configs) if c["capacity_qps"] is not None), None)
    assert n is not None, [c["search_summary"] for c in configs]
    search_file = runs / configs[n]["folder"] / "capacity.json"
    search = json.loads(search_file.read_text())
    other = next(t for t in search["trials"] if t["qps"] != search["capacity_qps"])
    search["trials"].insert(0, {**other, "qps": search["capacity_qps"], "passed": False})
    search_file.write_text(json.dumps(search))
    report = build([runs], tmp_path / "page", price=PRICE)
    first, again = configs[n], report["configurations"][n]
    shown = Path(again["at_capacity"]["folder"]).relative_to(runs)
    assert shown == Path(first["at_capacity"]["folder"]).relative_to(out / "runs") != Path(other["logs"])
    assert again["at_capacity"]["ttft_p99_ms"] == first["at_capacity"]["ttft_p99_ms"]


def test_a_configurations_note_and_its_quality_against_what_it_builds_on_are_on_the_page(report_run, tmp_path):
    # A numerics option's note (the system file's) goes with its configuration into the plan, and the
    # page shows it beside the configuration's quality, and among the page's notes.
    _, out, _, _ = report_run
    runs = tmp_path / "runs"
    shutil.copytree(out / "runs", runs)
    plan = json.loads((runs / "ablation.json").read_text())
    assert all(c["note"] == "" for c in plan["configs"])
    note = "CPU: weights rounded to FP8 and computed in fp32: its quality is FP8's, its speed is not"
    for config in plan["configs"]:
        del config["note"]  # a plan from before the notes: none
    plan["configs"][2]["note"] = note
    (runs / "ablation.json").write_text(json.dumps(plan))
    report = build([runs], tmp_path / "page", price=PRICE)
    chunked = report["configurations"][2]
    assert chunked["note"] == note and chunked["builds_on"] == "continuous batching"
    assert chunked["quality_change_on_builds_on"] == {k: 0.0 for k in chunked["quality_change"]}  # greedy, exact
    assert report["configurations"][0]["quality_change_on_builds_on"] == {}  # the first builds on nothing
    page = (tmp_path / "page" / "report.html").read_text()
    quality = Tables(page).tables["quality"]
    header = quality[0]
    rows = {row[0]: dict(zip(header, row)) for row in quality[1:]}
    assert rows["chunked prefill"]["note"] == note and rows["static batching"]["note"] == ""
    assert rows["chunked prefill"]["builds on"] == "continuous batching"
    assert rows["chunked prefill"]["change against what it builds on"].startswith("rouge1 +0.00%, rouge2 +0.00%")
    assert rows["static batching"]["change against what it builds on"] == "n/a"
    assert rows["chunked prefill"]["meets 99%"] == "yes"
    assert f"<p class='note'>chunked prefill: {html.escape(note)}</p>" in page
    md = (tmp_path / "page" / "report.md").read_text()
    assert f"- note: chunked prefill: {note}" in md and f"| {note} |" in md


def test_headless_chromium_renders_the_page_with_every_image(report_run):
    _, out, _, _ = report_run
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "headless Chromium is not installed: `make browser` installs Debian's package"
    done = subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--virtual-time-budget=10000",
            "--dump-dom",
            (out / "report.html").as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    body = re.search(r"<body([^>]*)>", done.stdout).group(1)
    total = int(re.search(r'data-images-total="(\d+)"', body).group(1))
    loaded = int(re.search(r'data-images-loaded="(\d+)"', body).group(1))
    assert total == loaded == 5  # the capacity chart at the top, then the four plots
    assert done.stdout.index('alt="capacity"') < done.stdout.index('id="headline"')
    assert 'id="headline"' in done.stdout and "static batching" in done.stdout


# ---- the hardware's bound ------------------------------------------------------------------------


def test_the_engine_counts_the_least_its_steps_read_and_compute(tiny_llama):
    from sut import LLM, SamplingParams

    llm = LLM(tiny_llama[0], num_kv_blocks=64, device="cpu")
    llm.generate([[5] * 10], SamplingParams(max_tokens=3, ignore_eos=True))
    busy = llm.engine.busy_stats()
    # One prefill step of 10 tokens, then two decode steps: the K/V of 10, 11 and 12 tokens read.
    assert (busy["steps"], busy["tokens"], busy["attended_tokens"]) == (3, 12, 33)
    # The tiny Llama (tests/helpers.py): fp32 linears of 2 x (q 64x64, k and v 64x32, o 64x64, gate, up
    # and down 64x128) and an untied LM head 256x64; K and V of 2 layers x 2 heads x 16 per token.
    weights, kv_per_token = 4 * (2 * (4096 + 2 * 2048 + 4096 + 3 * 8192) + 256 * 64), 4 * 2 * 2 * 2 * 16
    assert llm.engine.runner.weight_bytes_read == weights
    assert busy["min_bytes_read"] == 3 * weights + 33 * kv_per_token
    assert busy["min_flops"] == 12 * 2 * 2 * (64 * 12 * 16 + 3 * 64 * 128)


def test_a_linear_computed_from_blocks_counts_the_blocks_alone():
    from torch import nn

    from sut.model.loader import forward_weight_bytes

    class Blocks:
        nbytes = 100

    class FromBlocks(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks, self.dense = Blocks(), nn.Linear(8, 4, bias=False)  # the dense copy is not read too

    model = nn.Sequential(FromBlocks(), nn.Linear(4, 2, bias=False), nn.Embedding(50, 4))
    assert forward_weight_bytes(model) == 100 + 4 * 2 * 4


def test_the_bound_is_the_larger_of_memory_and_compute_time():
    from harness.measure.roofline import bound

    peaks = {"bandwidth_gbps": 10.0, "flops_tflops": 0.1}
    busy = {"prefill_s": 1.0, "decode_s": 3.0, "min_bytes_read": 20e9, "min_flops": 1e11}
    b = bound(busy, peaks)
    assert (b["bound_s"], b["bound_by"], b["share_of_bound"]) == (2.0, "memory", 0.5)
    b = bound({**busy, "min_flops": 3e11}, peaks)
    assert (b["bound_s"], b["bound_by"]) == (3.0, "compute")
    assert bound({"prefill_s": 1.0, "decode_s": 3.0}, peaks) is None  # a run from before the counts
    # Arithmetic the peak was not measured in (int16 dot products): the memory term alone.
    b = bound({**busy, "min_flops": 3e11}, peaks, measured_arithmetic=False)
    assert (b["bound_s"], b["bound_by"]) == (2.0, "memory (no peak measured for its arithmetic)")


def test_report_settings_refuse_what_is_malformed():
    from harness.config import HarnessConfigError
    from harness.measure.ablation import report_settings
    from systems.schema import System

    demo = System.load("cpu-demo")
    assert report_settings(demo, "llama3.1-8b")["capacity_spread"] == 0.5  # measurements/README.md
    own = dict(demo.report)
    for key, value, message in (
        ("capacity_spread", -0.1, "capacity_spread must be a fraction >= 0, got -0.1"),
        ("capacity_spread", "wide", "capacity_spread must be a fraction >= 0, got 'wide'"),
        ("samples", 0, "samples must be a positive integer, got 0"),
        ("budget", 3, "unknown keys ['budget']"),
        ("layouts", [{"name": "two"}], "layouts[0] must be an object with a name, its engine settings"),
        ("proposers", {"method": "ngram"}, "proposers must be a list of speculative_config values"),
        ("proposers", [{"method": "mtp", "benchmarks": "deepseek-r1"}], "proposers[0] must be a speculative_config"),
    ):
        demo.report = {**own, key: value}
        with pytest.raises(HarnessConfigError, match=re.escape(message)):
            report_settings(demo, "llama3.1-8b")


def test_a_proposer_for_other_benchmarks_is_left_out():
    """A proposer naming its benchmarks (a model's own MTP module or EAGLE3 head) is measured for
    those alone, without the key in its speculative_config."""
    from harness.measure.ablation import report_settings
    from systems.schema import System

    demo = System.load("cpu-demo")
    ngram = {"method": "ngram", "num_speculative_tokens": 2}
    demo.report = {**demo.report, "proposers": [{"method": "mtp", "benchmarks": ["deepseek-r1"]}, ngram]}
    assert report_settings(demo, "llama3.1-8b")["proposers"] == [ngram]
    assert report_settings(demo, "deepseek-r1")["proposers"] == [{"method": "mtp"}, ngram]


def test_layouts_build_on_the_systems_own_settings_and_a_comparison_selects_by_label():
    from harness.config import HarnessConfigError
    from harness.measure.ablation import configurations, select
    from systems.schema import System

    demo = System.load("cpu-demo")
    configs = configurations(demo, "llama3.1-8b", 100)
    own = next(c for c in configs if c.label == "int16 activations")  # the last numerics option: the system's own
    layouts = [c for c in configs if c.folder.startswith("06-layout-")]
    assert [c.label for c in layouts] == [layout["name"] for layout in demo.report["layouts"]]
    for config, layout in zip(layouts, demo.report["layouts"]):
        assert config.builds_on == own.label and config.engine == {**own.engine, **layout["engine"]}
    interactive = configurations(demo, "llama3.1-8b", 100, "Interactive")
    assert (
        interactive[-1].engine["tpot_target_ms"] == demo.engine_settings("Interactive", "llama3.1-8b")["tpot_target_ms"]
    )
    chosen = select(configs, ["INT16", "disaggregated"])
    assert [c.label for c in chosen] == [own.label] + [c.label for c in layouts if "disaggregated" in c.label]
    with pytest.raises(HarnessConfigError, match="no configuration's label contains any of"):
        select(configs, ["nothing"])


def test_a_page_rebuilt_with_a_wider_spread_decides_less(report_run, tmp_path):
    _, out, _, _ = report_run
    report = build([out / "runs"], tmp_path / "page", price=PRICE, spread=100.0)
    assert report["capacity_spread"] == 100.0
    verdicts = [c["verdict"] for c in report["configurations"]]
    assert verdicts[0].startswith(("the baseline", "no rate met"))
    assert all(v.startswith("undecided") for v in verdicts[1:] if not v.startswith("wins: a capacity where")), verdicts
    assert "run-to-run spread of 10000%" in (tmp_path / "page" / "report.md").read_text()
