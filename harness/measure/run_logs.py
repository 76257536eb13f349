"""One LoadGen run's folder as data, for the measurement report (harness/measure/report.py): LoadGen's
detail log (its percentiles and rates, as it computed them), each query's first-token and
end-to-end latency from LoadGen's trace, each response from the accuracy log (a performance run
logs them all with `harness run --log-responses`), and the harness's run.json (the conditions, and
the engine's busy time split between prefill and decode).

LoadGen's trace (mlperf_log_trace.json) is one event per line, and not valid JSON as a whole (its
LogDetail events double their quotes), so the lines are matched: per query a `Sample` begin event
(its sequence number, sample index, and its completion after the time it was scheduled for) and a
`Token_Latency` counter (its issue delay and the time from issue to first token) at the same
scheduled time stamp, which pairs them. Latencies count from the scheduled time, as LoadGen's do."""

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from accuracy.accuracy_log import read_accuracy_entries
from compliance.loadgen_logs import RUN_RECORD, read_detail_log
from compliance.run_folder import STATUS_FILE, RunFolderError, complete_run

DETAIL_LOG = "mlperf_log_detail.txt"
REPLAY_LOG = "replay.json"  # harness/measure/replay.py's, in place of LoadGen's logs
SAMPLE_EVENT = re.compile(
    r'^\{"name":"Sample","cat":"default","ph":"b",.*"ts":([0-9.]+),"args":\{"sample_seq":(\d+),'
    r'"query_seq":\d+,"sample_idx":(\d+),"issue_start_ns":(\d+),"complete_ns":(\d+)\}'
)
FIRST_TOKEN_EVENT = re.compile(
    r'^\{"name":"Token_Latency","ph": ?"C",.*"ts":([0-9.]+),"args":\{ ?"issue_delay":(\d+),'
    r'"issue_to_done":(\d+)\}'
)


class RunLogError(ValueError):
    pass


@dataclass
class Query:
    sample_seq: int  # LoadGen's sequence number of the sample (the accuracy log's seq_id)
    qsl_idx: int
    ttft_ns: int
    latency_ns: int
    num_tokens: int | None = None  # from the accuracy log
    scheduled_s: float | None = None  # when LoadGen scheduled it, from its trace's clock
    tokens: list[int] | None = None

    @property
    def tpot_ns(self) -> float | None:
        """LoadGen's time per output token: the time after the first token over the tokens after it."""
        if self.num_tokens is None or self.num_tokens < 2:
            return None
        return (self.latency_ns - self.ttft_ns) / (self.num_tokens - 1)


@dataclass
class RunLogs:
    folder: Path
    detail: dict
    record: dict  # run.json, or {} for logs the harness did not write
    queries: list[Query] = field(default_factory=list)  # latency scenarios only, in issue order
    responses: dict[int, list[int]] = field(default_factory=dict)  # sample index -> its first response's tokens

    @property
    def scenario(self) -> str:
        return self.detail.get("effective_scenario", "")

    @property
    def duration_s(self) -> float | None:
        """The run's length as LoadGen's completed-samples rate implies it (None in accuracy mode,
        where LoadGen computes no rates)."""
        rate = self.detail.get("result_completed_samples_per_sec")
        return self.detail["result_query_count"] / rate if rate else None

    def percentile_ms(self, kind: str, percentile: str) -> float | None:
        """LoadGen's own percentile ("50.00", "99.00", ...) of "ttft" or "tpot", in ms (None where
        LoadGen computed none: accuracy mode)."""
        key = (
            f"result_first_token_{percentile}_percentile_latency_ns"
            if kind == "ttft"
            else f"result_time_per_output_token_{percentile}_percentile_ns"
        )
        return self.detail[key] / 1e6 if key in self.detail else None

    def goodput(self, ttft_ms: float, tpot_ms: float) -> tuple[int, float] | None:
        """(queries that met both targets, those per second of the run), DistServe's goodput; None
        when the token counts or the run's length are unknown. A one-token response meets any TPOT."""
        if not self.queries or self.duration_s is None or any(q.num_tokens is None for q in self.queries):
            return None
        good = sum(1 for q in self.queries if meets(q, ttft_ms, tpot_ms))
        return good, good / self.duration_s


def meets(query: Query, ttft_ms: float, tpot_ms: float) -> bool:
    return query.ttft_ns <= ttft_ms * 1e6 and (query.tpot_ns is None or query.tpot_ns <= tpot_ms * 1e6)


def read_run(folder: Path) -> RunLogs:
    """A complete run's folder (compliance/run_folder.py): a killed, failed or changed one is refused."""
    folder = Path(folder)
    if (folder / REPLAY_LOG).is_file() and not (folder / DETAIL_LOG).is_file():
        return read_replay(folder)
    if not (folder / DETAIL_LOG).is_file():
        if (folder / STATUS_FILE).is_file():  # a run's folder without its logs: say what became of the run
            try:
                complete_run(folder)
            except RunFolderError as e:
                raise RunLogError(str(e)) from None
        raise RunLogError(f"{folder}: no {DETAIL_LOG} (not a LoadGen run's folder)")
    try:
        complete_run(folder, needs=(DETAIL_LOG,))
        detail, _ = read_detail_log(folder / DETAIL_LOG)
        record = json.loads((folder / RUN_RECORD).read_text()) if (folder / RUN_RECORD).is_file() else {}
    except RunFolderError as e:
        raise RunLogError(str(e)) from None
    except ValueError as e:  # JSON: the files are hashed as the run wrote them, so this is a run's own fault
        raise RunLogError(f"{folder}: cannot read its logs ({e})") from None
    run = RunLogs(folder, detail, record)
    if run.scenario == "Server":
        run.queries = read_queries(folder)
        for q in run.queries:
            if q.tokens is not None:
                run.responses.setdefault(q.qsl_idx, q.tokens)
    elif (folder / "mlperf_log_accuracy.json").is_file():
        for entry in read_accuracy_entries(folder / "mlperf_log_accuracy.json"):
            run.responses.setdefault(entry["qsl_idx"], entry["data"])
    return run


def read_queries(folder: Path) -> list[Query]:
    """Every query of a Server-scenario run: its latencies from the trace, its response (where the
    accuracy log has it)."""
    trace = folder / "mlperf_log_trace.json"
    if not trace.is_file():
        raise RunLogError(f"{trace}: not found (LoadGen writes it beside the detail log)")
    samples, first_tokens = {}, {}
    with trace.open() as f:
        for line in f:
            if line.startswith('{"name":"Sample"'):
                match = SAMPLE_EVENT.match(line)
                if match:
                    ts, seq, idx, _, done = match.groups()
                    if ts in samples:
                        raise RunLogError(
                            f"{trace}: two queries scheduled at {ts} us: their first tokens cannot be paired"
                        )
                    samples[ts] = (int(seq), int(idx), int(done))
            elif line.startswith('{"name":"Token_Latency"'):
                match = FIRST_TOKEN_EVENT.match(line)
                if match:
                    first_tokens[match.group(1)] = int(match.group(2)) + int(match.group(3))
    missing = sorted(set(samples) - set(first_tokens))
    if missing:
        raise RunLogError(f"{trace}: {len(missing)} queries have no first-token event (the first at {missing[0]} us)")
    queries = sorted(
        (
            Query(seq, idx, first_tokens[ts], latency, scheduled_s=float(ts) / 1e6)
            for ts, (seq, idx, latency) in samples.items()
        ),
        key=lambda q: q.sample_seq,
    )
    accuracy_log = folder / "mlperf_log_accuracy.json"
    if accuracy_log.is_file():
        by_seq = {q.sample_seq: q for q in queries}
        for entry in read_accuracy_entries(accuracy_log):
            query = by_seq.get(entry["seq_id"])
            if query is None:
                raise RunLogError(f"{accuracy_log}: response seq_id {entry['seq_id']} is no query of the trace")
            query.tokens = entry["data"]
            query.num_tokens = entry["token_count"] if entry["token_count"] is not None else len(entry["data"])
    return queries


def read_replay(folder: Path) -> RunLogs:
    """A replay's folder (harness/measure/replay.py) as a LoadGen Server run's: its queries, and the detail
    LoadGen would have logged for them (its percentile rule, its p99 check against the limits)."""
    try:
        complete_run(folder, needs=(REPLAY_LOG,))
        log = json.loads((folder / REPLAY_LOG).read_text())
        record = json.loads((folder / RUN_RECORD).read_text()) if (folder / RUN_RECORD).is_file() else {}
    except RunFolderError as e:
        raise RunLogError(str(e)) from None
    except ValueError as e:
        raise RunLogError(f"{folder}: cannot read its logs ({e})") from None
    queries = [
        Query(i, q["sample"], q["ttft_ns"], q["latency_ns"], len(q["tokens"]), q["tokens"])
        for i, q in enumerate(log["queries"])
    ]
    span_s = max(q["scheduled_ns"] + q["latency_ns"] for q in log["queries"]) / 1e9
    tokens = sum(q.num_tokens for q in queries)
    detail = {
        "effective_scenario": "Server",
        "effective_target_qps": log["qps"],
        "result_query_count": len(queries),
        "result_completed_samples_per_sec": len(queries) / span_s,
        "result_completed_tokens_per_second": tokens / span_s,
        "result_validity": "n/a (a replay, not LoadGen)",
    }
    tpots = [q.tpot_ns for q in queries if q.tpot_ns is not None]
    for p, key in ((0.5, "50.00"), (0.9, "90.00"), (0.99, "99.00")):
        detail[f"result_first_token_{key}_percentile_latency_ns"] = loadgen_percentile([q.ttft_ns for q in queries], p)
        detail[f"result_{key}_percentile_latency_ns"] = loadgen_percentile([q.latency_ns for q in queries], p)
        if tpots:
            detail[f"result_time_per_output_token_{key}_percentile_ns"] = loadgen_percentile(tpots, p)
    ttft_ms, tpot_ms = log["limits_ms"]
    detail["result_perf_constraints_met"] = (
        detail["result_first_token_99.00_percentile_latency_ns"] <= (ttft_ms * 1e6)
        and detail.get("result_time_per_output_token_99.00_percentile_ns", 0) <= tpot_ms * 1e6
    )
    run = RunLogs(folder, detail, record, queries)
    for q in queries:
        run.responses.setdefault(q.qsl_idx, q.tokens)
    return run


def loadgen_percentile(values: list[float], percentile: float) -> float:
    """A percentile as LoadGen takes it (results.cc): the sorted values at index
    min(n - 1, floor(percentile * n))."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(percentile * len(ordered)))]
