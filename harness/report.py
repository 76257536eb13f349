"""The measurement report: for each run, TTFT and TPOT at p50 and p99, throughput, goodput, cost per
million input and output tokens and output quality, beside the conditions it was measured under,
as one HTML page and the same tables in Markdown (harness/report_page.py).

    python -m harness.report [--system cpu-demo] [--benchmark llama3.1-8b]   # run the ablation, then the page
    python -m harness.report --logs DIR [DIR ...]                             # the page from existing runs

Where each figure comes from (the page says it too):
- TTFT and TPOT p50/p99, tokens/s and completed queries/s: LoadGen's detail log, as LoadGen
  computed them.
- Goodput (DistServe's definition): the queries that met both the TTFT and the TPOT target, per
  second of the run (the run's length as LoadGen's completed-queries rate implies it). Each query's
  TTFT and end-to-end latency come from LoadGen's trace, its token count from the accuracy log, its
  TPOT as LoadGen computes it: (latency - TTFT) / (tokens - 1); a one-token response meets any TPOT
  target. Targets: the benchmark's Server limits unless given.
- Cost: price per hour x the run's length, split between input and output tokens in the shares of
  the engine's busy time spent on prefill and on decode (Scheduler.record_step: a step with both
  gives its decodes what a decode-only step costs at the time, its prefill the rest); idle time is
  split in the same shares. Per million input tokens: cost x prefill share / input tokens x 1e6;
  per million output tokens: cost x decode share / output tokens x 1e6.
- Quality: the benchmark's accuracy metrics (ROUGE for the summarization ones) of the run's own
  responses, first response per sample, against the same samples' references; the change against
  the first run; its target 99% of the first run's score on those samples (the benchmark's rule,
  applied to this set of samples).
"""

import argparse
import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from accuracy.dataset import DatasetError, load_dataset
from accuracy.report import summarization_accuracy
from harness.ablation import PLAN, report_settings, run_configurations
from harness.config import HarnessConfigError
from harness.report_page import write_page
from harness.run_logs import DETAIL_LOG, RunLogError, RunLogs, read_run
from systems.benchmarks import BENCHMARKS
from systems.schema import REPO, System, SystemConfigError

QUALITY_METRICS = ("rouge1", "rouge2", "rougeL", "rougeLsum")
QUALITY_TARGET = 0.99


@dataclass
class Figures:
    """One run's numbers on the page."""

    label: str
    folder: str
    kind: str  # "ablation", "sweep", or "run" (a folder given with --logs)
    change: str
    builds_on: str | None
    target_qps: float | None
    queries: int
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    tpot_p50_ms: float | None
    tpot_p99_ms: float | None
    tokens_per_s: float | None  # None in accuracy mode (LoadGen computes no rates there)
    completed_qps: float | None
    duration_s: float | None
    goodput_qps: float | None = None
    good_queries: int | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    prefill_share: float | None = None
    cost_per_m_input: float | None = None
    cost_per_m_output: float | None = None
    in_sweep: bool = False  # a point of the load sweep (harness/ablation.py)
    quality: dict = field(default_factory=dict)  # metric -> score
    quality_change: dict = field(default_factory=dict)  # metric -> % against the first run
    meets_quality_target: bool | None = None
    ttfts_ms: list = field(default_factory=list)  # per query, for the CDFs
    tpots_ms: list = field(default_factory=list)


def goodput(run: RunLogs, ttft_ms: float, tpot_ms: float) -> tuple[int, float] | None:
    """(queries that met both targets, those per second); None when the token counts or the run's
    length are unknown."""
    if not run.queries or run.duration_s is None or any(q.num_tokens is None for q in run.queries):
        return None
    good = sum(
        1 for q in run.queries if q.ttft_ns <= ttft_ms * 1e6 and (q.tpot_ns is None or q.tpot_ns <= tpot_ms * 1e6)
    )
    return good, good / run.duration_s


def cost_per_million(
    price_per_hour: float, duration_s: float, busy_s: dict, input_tokens: int, output_tokens: int
) -> tuple[float, float, float]:
    """(prefill share, cost per million input tokens, per million output tokens)."""
    cost = price_per_hour * duration_s / 3600
    busy = busy_s["prefill_s"] + busy_s["decode_s"]
    share = busy_s["prefill_s"] / busy if busy else 0.5
    return share, cost * share / input_tokens * 1e6, cost * (1 - share) / output_tokens * 1e6


def figures_for(
    run: RunLogs,
    label: str,
    kind: str,
    targets: tuple[float, float],
    price: float | None,
    prompts: list[list[int]] | None,
    change: str = "",
    builds_on: str | None = None,
    target_qps: float | None = None,
    in_sweep: bool = False,
) -> Figures:
    d = run.detail
    fig = Figures(
        label,
        run.folder.name,
        kind,
        change,
        builds_on,
        target_qps or d.get("effective_target_qps"),
        d["result_query_count"],
        run.percentile_ms("ttft", "50.00"),
        run.percentile_ms("ttft", "99.00"),
        run.percentile_ms("tpot", "50.00"),
        run.percentile_ms("tpot", "99.00"),
        d.get("result_completed_tokens_per_second"),
        d.get("result_completed_samples_per_sec"),
        run.duration_s,
        in_sweep=in_sweep,
    )
    fig.ttfts_ms = [q.ttft_ns / 1e6 for q in run.queries]
    fig.tpots_ms = [q.tpot_ns / 1e6 for q in run.queries if q.tpot_ns is not None]
    good = goodput(run, *targets)
    if good is not None:
        fig.good_queries, fig.goodput_qps = good
        fig.output_tokens = sum(q.num_tokens for q in run.queries)
        if prompts is not None:
            fig.input_tokens = sum(len(prompts[q.qsl_idx]) for q in run.queries)
    busy = run.record.get("busy_s")
    if price is not None and busy and fig.input_tokens and fig.output_tokens:
        fig.prefill_share, fig.cost_per_m_input, fig.cost_per_m_output = cost_per_million(
            price, fig.duration_s, busy, fig.input_tokens, fig.output_tokens
        )
    return fig


def quality(run: RunLogs, references: list[str], tokenizer) -> tuple[dict, set[int]]:
    """The accuracy metrics of the run's responses (the first per sample) and the samples they cover."""
    responses: dict[int, list[int]] = {}
    for q in run.queries:
        if q.tokens is not None:
            responses.setdefault(q.qsl_idx, q.tokens)
    if not responses:
        return {}, set()
    order = sorted(responses)
    predictions = tokenizer.batch_decode([responses[i] for i in order], skip_special_tokens=True)
    result = summarization_accuracy(predictions, [references[i] for i in order], [len(responses[i]) for i in order])
    return {k: float(result[k]) for k in (*QUALITY_METRICS, "tokens_per_sample")}, set(order)


def add_quality(figs: list[Figures], runs: list[RunLogs], references: list[str], tokenizer) -> list[str]:
    """Fill each run's quality and its change against the first run; return notes for the page."""
    notes, base, base_samples = [], None, None
    for fig, run in zip(figs, runs):
        fig.quality, samples = quality(run, references, tokenizer)
        if not fig.quality:
            continue
        if base is None:
            base, base_samples = fig.quality, samples
        if samples != base_samples:
            notes.append(f"{fig.label}: its responses cover other samples than the first run's; no change is given")
            continue
        fig.quality_change = {k: 100 * (fig.quality[k] - base[k]) / base[k] for k in QUALITY_METRICS if base[k]}
        fig.meets_quality_target = all(fig.quality[k] >= QUALITY_TARGET * base[k] for k in QUALITY_METRICS)
    return notes


def find_runs(folders: list[Path]) -> list[tuple[Path, dict]]:
    """Every LoadGen run under `folders` with its plan entry (label, kind, change) where an
    ablation's plan names it, in plan order, then the rest in path order."""
    found = []
    for top in folders:
        if not top.is_dir():
            raise RunLogError(f"{top}: not a folder")
        plan = json.loads((top / PLAN).read_text())["configs"] if (top / PLAN).is_file() else []
        planned = {c["folder"]: c for c in plan}
        runs = sorted(p.parent for p in top.rglob(DETAIL_LOG))
        if not runs:
            raise RunLogError(f"{top}: no LoadGen run under it (no {DETAIL_LOG})")
        order = {c["folder"]: i for i, c in enumerate(plan)}
        runs.sort(key=lambda p: (order.get(p.name, len(order)), str(p)))
        for path in runs:
            entry = planned.get(path.name) or {
                "label": str(path.relative_to(top)) if path != top else path.name,
                "kind": "run",
                "change": "",
                "builds_on": None,
                "target_qps": None,
            }
            found.append((path, entry))
    return found


def build(
    folders: list[Path],
    out: Path,
    targets: tuple[float, float] | None = None,
    price: float | None = None,
    root: Path = REPO,
    log=print,
) -> dict:
    """Read the runs, compute their figures, write the page and its Markdown; return the report's data."""
    found = find_runs(folders)
    runs = [read_run(path) for path, _ in found]
    latency_runs = [(run, entry) for run, (_, entry) in zip(runs, found) if run.queries]
    notes = [
        f"{run.folder}: a LoadGen {run.scenario or 'unknown'}-scenario run, left out (no per-query latencies)"
        for run in runs
        if not run.queries
    ]
    if not latency_runs:
        raise RunLogError("no Server-scenario run among " + ", ".join(map(str, folders)) + ": nothing to report")
    record = next((run.record for run, _ in latency_runs if run.record), {})
    benchmark = BENCHMARKS.get(record.get("benchmark", ""))
    if targets is None:
        if benchmark is None or "Server" not in benchmark.latency_limits_ms:
            raise RunLogError("the runs do not name a benchmark with Server limits: give --ttft-ms and --tpot-ms")
        targets = benchmark.latency_limits_ms["Server"]
    price_note = ""
    if price is None and record.get("system"):
        try:
            settings = report_settings(System.load(record["system"], root), record.get("benchmark", ""))
            price, price_note = settings.get("price_per_hour"), settings.get("price_note", "")
        except (SystemConfigError, HarnessConfigError):
            pass
    dataset = None
    if record.get("dataset"):
        try:
            dataset = load_dataset(record["dataset"])
        except DatasetError as e:
            log(f"report: no input token counts or quality: {e}")
    unlogged = [entry["label"] for run, entry in latency_runs if any(q.num_tokens is None for q in run.queries)]
    if unlogged:
        notes.append(
            f"{', '.join(unlogged)}: LoadGen's accuracy log lacks some responses (a submission's performance "
            "run logs none; the report's runs log all: harness run --log-responses), so goodput, cost "
            "and quality are not given"
        )
    figs = [
        figures_for(
            run,
            entry["label"],
            entry["kind"],
            targets,
            price,
            dataset and dataset.input_ids,
            entry.get("change", ""),
            entry.get("builds_on"),
            entry.get("target_qps"),
            entry.get("in_sweep", False),
        )
        for run, entry in latency_runs
    ]
    if dataset is not None and record.get("model"):
        from transformers import AutoTokenizer

        notes += add_quality(
            figs, [run for run, _ in latency_runs], dataset.references, AutoTokenizer.from_pretrained(record["model"])
        )
    report = {
        "method": __doc__.split("Where each figure comes from (the page says it too):\n", 1)[1].strip(),
        "quality_metrics": list(QUALITY_METRICS),
        "quality_target": QUALITY_TARGET,
        "targets_ms": {"ttft": targets[0], "tpot": targets[1]},
        "price_per_hour": price,
        "price_note": price_note,
        "notes": notes,
        "figures": [asdict(f) for f in figs],
        "runs": [
            {
                "folder": str(run.folder),
                "label": entry["label"],
                "record": run.record,
                "validity": run.detail.get("result_validity"),
                "loadgen": {
                    k: run.detail.get(k)
                    for k in (
                        "effective_target_qps",
                        "effective_min_query_count",
                        "effective_sample_concatenate_permutation",
                    )
                },
            }
            for run, entry in latency_runs
        ],
        "total_samples": len(dataset) if dataset is not None else None,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    write_page(report, out)
    return report


def headline(report: dict) -> str:
    """One line: the first and the last ablation run (or run) against each other."""
    figs = [f for f in report["figures"] if f["kind"] != "sweep"] or report["figures"]
    first, last = figs[0], figs[-1]

    def fmt(f):
        def num(key, digits):
            return "n/a" if f[key] is None else f"{f[key]:.{digits}f}"

        return (
            f"{f['label']}: p99 TTFT {num('ttft_p99_ms', 0)} ms, p99 TPOT {num('tpot_p99_ms', 1)} ms, "
            f"goodput {num('goodput_qps', 3)} q/s"
        )

    return f"{fmt(first)}; {fmt(last)}" if first is not last else fmt(first)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m harness.report", description=__doc__.split("\n\n")[0])
    parser.add_argument("--system", default="cpu-demo")
    parser.add_argument("--benchmark", default="llama3.1-8b")
    parser.add_argument("--logs", type=Path, nargs="+", help="build the page from these runs' folders (no runs)")
    parser.add_argument("--out", type=Path, default=REPO / "build" / "report")
    parser.add_argument("--root", type=Path, default=REPO, help="the folder holding systems/ and measurements/")
    parser.add_argument("--ttft-ms", type=float, help="goodput's TTFT target (default: the benchmark's Server limit)")
    parser.add_argument("--tpot-ms", type=float, help="goodput's TPOT target (default: the benchmark's Server limit)")
    parser.add_argument(
        "--price-per-hour", type=float, help="per accelerator- or machine-hour (default: the system file's)"
    )
    args = parser.parse_args()
    if (args.ttft_ms is None) != (args.tpot_ms is None):
        sys.exit("error: report: give both --ttft-ms and --tpot-ms, or neither")
    targets = (args.ttft_ms, args.tpot_ms) if args.ttft_ms is not None else None
    try:
        folders = args.logs
        if folders is None:
            runs_dir = args.out / "runs"
            run_configurations(args.system, args.benchmark, runs_dir, args.root)
            folders = [runs_dir]
        report = build(folders, args.out, targets, args.price_per_hour, args.root)
    except (HarnessConfigError, RunLogError, DatasetError, SystemConfigError) as e:
        sys.exit(f"error: report: {e}")
    print(f"report: {args.out / 'report.html'} ({len(report['figures'])} runs); {headline(report)}")


if __name__ == "__main__":
    main()
