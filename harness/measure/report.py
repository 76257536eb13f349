"""The measurement report: for each configuration of the ablation (harness/measure/ablation.py), its
throughput at saturation, its capacity at the latency targets, and at that capacity its latencies,
goodput and cost per million input and output tokens, each against the static-batching baseline,
and its output quality; as one HTML page and the same tables in Markdown (harness/measure/report_page.py).

    python -m harness.measure.report [--system cpu-demo] [--benchmark llama3.1-8b]   # run the ablation, then the page
    python -m harness.measure.report --logs DIR [DIR ...]                             # the page from existing runs

Where each figure comes from (the page says it too):
- Offline throughput: LoadGen's tokens/s of an Offline run of every report sample once, the
  configuration's engine saturated.
- Capacity: the highest arrival rate (LoadGen's Poisson schedule) at which a Server run of the
  configuration met both p99 targets, by LoadGen's own p99 check, found by a search (bracket, then
  bisection; harness/measure/capacity.py); the lowest rate that failed above it is given beside it. A
  report trial is short (its queries are given) and is not judged by early stopping, which needs
  460 queries or more: `make submission`'s search is, and its capacity is the one MLPerf scores.
  With 100 queries or fewer LoadGen's p99 is the slowest query, and a stall of the machine can
  spoil one trial, so the lowest rate that failed above a pass, where at most 5% of its queries
  missed a target, is run once more before the search goes below it, and a rate counts as met when
  either of its runs met the targets (as a rate at which a VALID run exists: a submitter reruns a
  spoilt run).
- TTFT and TPOT p50/p99, tokens/s and completed queries/s: LoadGen's detail log of the run at the
  capacity, as LoadGen computed them.
- Goodput (DistServe's definition): the queries that met both the TTFT and the TPOT target, per
  second of the run (the run's length as LoadGen's completed-queries rate implies it). Each query's
  TTFT and end-to-end latency come from LoadGen's trace, its token count from the accuracy log, its
  TPOT as LoadGen computes it: (latency - TTFT) / (tokens - 1); a one-token response meets any TPOT
  target. Targets: the benchmark's Server limits unless given. Goodput against arrival rate: the
  search's trials, and one trial at half the capacity where the configuration's share of the
  budget allowed it (capacity.json says why not, where not), to show goodput well below capacity.
- Cost at the capacity: the price per hour over the tokens per hour the run served within the
  targets (the input and output tokens of the queries that met both), split between input and
  output in the shares of the engine's busy time spent on prefill and on decode
  (Scheduler.record_step: a step with both gives its decodes what a decode-only step costs at the
  time, its prefill the rest): per million input tokens, price x run length x prefill share / input
  tokens within the targets x 1e6; per million output tokens, the same with the decode share.
- Cost against the TPOT target: for each TPOT target, the highest trial rate of the search whose
  p99 TTFT and TPOT met the targets, and its cost per million output tokens within those targets
  (a looser target lets a larger batch through: more tokens per hour, each one slower).
- Ratios: against the static-batching configuration, the MLPerf reference SUTs' batching.
- Verdicts (against the configuration built on): wins or LOSES only where the two searches'
  brackets (capacity, rate failed above it) do not overlap, by the machine's run-to-run spread of
  a capacity (the system file's report.capacity_spread, measured by running the report again; the
  page gives it) besides; else undecided. Then what the prediction says, named as such: the
  capacity harness/predict simulates for the configuration (the engine's own scheduler on a virtual
  clock, the report's trials' arrivals and query counts, each step costing what a step-cost model
  profiled on the configuration's engine after its runs says, its Offline run's output lengths),
  with a band from the model's fit error; it wins or loses where the two bands do not overlap, and
  the line gives how far this report's predictions were from their measured capacities.
- Predicted capacity and its error: that simulation's capacity (band), and the measured capacity
  over it, less 1.
- The hardware's bound (harness/measure/roofline.py): the least time a run's steps could take, the larger
  of the bytes they must read (the weights once per step, each attended token's K/V once) over the
  bandwidth measured here and of their linear FLOPs over the FLOP/s measured here; the engine's busy
  time against it says how far from the limit a configuration runs.
- Quality: the benchmark's accuracy metrics (ROUGE for the summarization ones) of the Offline
  run's responses, every report sample once, against their references; the change against the
  first configuration, and against the configuration it builds on where that one is in the report
  (a numerics option's own cost, where it builds on another one's); its target 99% of the first
  configuration's score on those samples (the benchmark's rule, applied to this set of samples).
  A configuration's note (the system file's, for a numerics option) says what its numbers mean on
  the machine: on a CPU, FP8 weights are rounded to FP8 and computed in fp32, for their quality.
"""

import argparse
import json
import statistics
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from accuracy.datasets.reader import DatasetError, load_dataset
from accuracy.report import summarization_accuracy
from harness.config import HarnessConfigError
from harness.measure.ablation import NUMERICS_FOLDER, PEAKS, PLAN, SCENARIO, report_settings, run_configurations
from harness.measure.capacity import CapacityError
from harness.measure.report_page import write_page
from harness.measure.roofline import bound
from harness.measure.run_logs import DETAIL_LOG, REPLAY_LOG, RunLogError, RunLogs, meets, read_run
from systems.benchmarks import BENCHMARKS
from systems.paths import report_dir
from systems.schema import REPO, System, SystemConfigError

QUALITY_METRICS = ("rouge1", "rouge2", "rougeL", "rougeLsum")
QUALITY_TARGET = 0.99
TPOT_TARGETS_MS = (25, 50, 75, 100, 150, 200)  # the cost-against-target plot's, with the benchmark's own


@dataclass
class Figures:
    """One LoadGen run's numbers on the page."""

    label: str
    folder: str
    scenario: str
    target_qps: float | None
    queries: int  # Offline: samples
    ttft_p50_ms: float | None = None
    ttft_p99_ms: float | None = None
    tpot_p50_ms: float | None = None
    tpot_p99_ms: float | None = None
    tokens_per_s: float | None = None  # None in accuracy mode (LoadGen computes no rates there)
    completed_qps: float | None = None  # Server: completed queries/s; Offline: samples/s
    duration_s: float | None = None
    validity: str | None = None  # LoadGen's
    p99s_met: bool | None = None  # LoadGen's check of the p99s against the limits (Server)
    goodput_qps: float | None = None
    good_queries: int | None = None
    input_tokens: int | None = None  # of the queries within the targets
    output_tokens: int | None = None
    prefill_share: float | None = None
    cost_per_m_input: float | None = None
    cost_per_m_output: float | None = None
    quality: dict = field(default_factory=dict)  # metric -> score
    bound: dict | None = None  # the hardware's bound on its steps (harness/measure/roofline.py)
    ttfts_ms: list = field(default_factory=list)  # per query, for the CDFs
    tpots_ms: list = field(default_factory=list)


def cost_per_million(
    price_per_hour: float, duration_s: float, busy_s: dict, input_tokens: int, output_tokens: int
) -> tuple[float, float | None, float | None]:
    """(prefill share, cost per million input tokens, per million output tokens) of a run that served
    these tokens within the targets in `duration_s`; None where it served none."""
    cost = price_per_hour * duration_s / 3600
    busy = busy_s["prefill_s"] + busy_s["decode_s"]
    share = busy_s["prefill_s"] / busy if busy else 0.5
    per_input = cost * share / input_tokens * 1e6 if input_tokens else None
    per_output = cost * (1 - share) / output_tokens * 1e6 if output_tokens else None
    return share, per_input, per_output


def figures_for(
    run: RunLogs,
    label: str,
    targets: tuple[float, float],
    price: float | None,
    prompts: list[list[int]] | None,
    peaks: dict | None = None,
    measured_arithmetic: bool = True,
) -> Figures:
    d = run.detail
    offline = run.scenario == "Offline"
    fig = Figures(
        label,
        str(run.folder),
        run.scenario,
        d.get("effective_target_qps"),
        # Offline: one query of every sample; its samples counted by their responses where logged
        len(run.responses) if offline and run.responses else d.get("result_query_count", 0),
        run.percentile_ms("ttft", "50.00"),
        run.percentile_ms("ttft", "99.00"),
        run.percentile_ms("tpot", "50.00"),
        run.percentile_ms("tpot", "99.00"),
        d.get("result_tokens_per_second" if offline else "result_completed_tokens_per_second"),
        d.get("result_samples_per_second" if offline else "result_completed_samples_per_sec"),
        run.duration_s,
        d.get("result_validity"),
        d.get("result_perf_constraints_met") if not offline else None,
    )
    if run.record.get("busy_s") and peaks:
        fig.bound = bound(run.record["busy_s"], peaks, measured_arithmetic)
    fig.ttfts_ms = [q.ttft_ns / 1e6 for q in run.queries]
    fig.tpots_ms = [q.tpot_ns / 1e6 for q in run.queries if q.tpot_ns is not None]
    good = run.goodput(*targets)
    if good is None:
        return fig
    fig.good_queries, fig.goodput_qps = good
    within = [q for q in run.queries if meets(q, *targets)]
    fig.output_tokens = sum(q.num_tokens for q in within)
    if prompts is not None:
        fig.input_tokens = sum(len(prompts[q.qsl_idx]) for q in within)
    busy = run.record.get("busy_s")
    if price is not None and busy and fig.input_tokens is not None:
        fig.prefill_share, fig.cost_per_m_input, fig.cost_per_m_output = cost_per_million(
            price, fig.duration_s, busy, fig.input_tokens, fig.output_tokens
        )
    return fig


def quality(run: RunLogs, references: list[str], tokenizer) -> dict:
    """The accuracy metrics of the run's responses (the first per sample that has a reference: a
    traffic sample may give lengths alone)."""
    order = sorted(i for i in run.responses if references[i])
    if not order:
        return {}
    predictions = tokenizer.batch_decode([run.responses[i] for i in order], skip_special_tokens=True)
    lengths = [len(run.responses[i]) for i in order]
    result = summarization_accuracy(predictions, [references[i] for i in order], lengths)
    return {k: float(result[k]) for k in (*QUALITY_METRICS, "tokens_per_sample")}


def cost_by_tpot_target(trials: list[tuple[RunLogs, Figures]], ttft_ms: float, tpot_limit_ms: float, price, prompts):
    """Per TPOT target (TPOT_TARGETS_MS and the benchmark's): the highest trial rate whose p99 TTFT
    and TPOT met the targets, and its cost per million output tokens within them."""
    out = []
    for target in sorted({*TPOT_TARGETS_MS, tpot_limit_ms}):
        met = [
            (fig.target_qps, run)
            for run, fig in trials
            if fig.ttft_p99_ms is not None and fig.ttft_p99_ms <= ttft_ms and fig.tpot_p99_ms <= target
        ]
        if not met:
            out.append({"tpot_ms": target, "qps": None, "cost_per_m_output": None})
            continue
        qps, run = max(met, key=lambda m: m[0])
        fig = figures_for(run, "", (ttft_ms, target), price, prompts)
        out.append({"tpot_ms": target, "qps": qps, "cost_per_m_output": fig.cost_per_m_output})
    return out


def ratio(value, base) -> float | None:
    return value / base if value is not None and base else None


def verdict(config: dict, builds_on: dict | None, spread: float = 0.0) -> str:
    """The configuration against the one it builds on, in words: capacity first, then quality. A
    search ends with a bracket (the rate passed, the rate failed above it); only brackets that do not
    overlap decide a winner: where they overlap, the page says the comparison is undecided. `spread`
    (report.capacity_spread): how far apart two runs' capacities of one configuration came out on the
    machine, as a fraction; a winner's capacity must clear the other's failed rate by that much too,
    a loser's failed rate stay that far under the other's capacity."""
    said = []
    mine, top = config["capacity_qps"], config.get("failed_qps")
    base = builds_on and builds_on["capacity_qps"]
    base_top = builds_on and builds_on.get("failed_qps")
    if builds_on is None:
        said.append("the baseline" if mine is not None else f"no rate met the targets ({config['search_summary']})")
    elif mine is None and base is not None and top is not None and top * (1 + spread) > base:
        said.append(
            f"undecided: no rate met the targets down to {top:.3f} QPS, above the capacity of "
            f"{builds_on['label']} ({base:.3f}) ({config['search_summary']})"
        )
    elif mine is None:
        said.append(f"LOSES: no rate met the targets ({config['search_summary']})")
    elif base is None:
        said.append(f"wins: a capacity where {builds_on['label']} had none")
    else:
        change, margin = mine / base, 1 + spread
        if base_top is not None and mine >= base_top * margin:
            said.append(f"wins: {change:.2f}x the capacity of {builds_on['label']}")
        elif top is not None and top * margin <= base:
            said.append(f"LOSES: {change:.2f}x the capacity of {builds_on['label']}")
        elif (base_top is not None and mine >= base_top) or (top is not None and top <= base):  # brackets apart
            said.append(
                f"undecided: {change:.2f}x the capacity of {builds_on['label']}, within the run-to-run spread of "
                f"{spread:.0%} measured for this machine (report.capacity_spread)"
            )
        else:
            said.append(
                f"undecided: {change:.2f}x the capacity of {builds_on['label']}, but the searches' brackets "
                f"overlap ({mine:.3f}-{top or float('inf'):.3f} against {base:.3f}-{base_top or float('inf'):.3f} QPS)"
            )
    if config["meets_quality_target"] is False:
        said.append(f"quality under {QUALITY_TARGET:.0%} of the first configuration's")
    return "; ".join(said)


def predicted_verdict(config: dict, builds_on: dict | None, errors: list[float], reanchored: list[float] = ()) -> str:
    """What the predictions (harness/predict) say of the configuration against the one it builds on,
    as a prediction, never as a measurement: it wins or loses where the two predicted bands (each
    capacity with its step-cost model's fit error) do not overlap; and how far this report's
    predictions were from their measured capacities (`errors`; `reanchored`: those re-anchored on
    each configuration's first trial), for the reader to weigh it."""
    mine, theirs = config["predicted"], (builds_on or {}).get("predicted") or {}
    if builds_on is None or not mine.get("qps") or not theirs.get("qps"):
        return ""
    change = mine["qps"] / theirs["qps"]
    if (mine.get("low") or mine["qps"]) > (theirs.get("high") or theirs["qps"]):
        says = "wins"
    elif (mine.get("high") or mine["qps"]) < (theirs.get("low") or theirs["qps"]):
        says = "loses"
    else:
        says = "is even (the predicted bands overlap)"
    record = (
        f"this report's predictions were off their measured capacities by a median {statistics.median(errors):.0%}, "
        f"at most {max(errors):.0%}, over {len(errors)} configurations"
        if errors
        else "no prediction here has a measurement to compare with"
    )
    if reanchored:
        record += (
            f"; re-anchored on their first trials, by a median {statistics.median(reanchored):.0%}, at most "
            f"{max(reanchored):.0%}, over {len(reanchored)}"
        )
    return (
        f"predicted: it {says}, {change:.2f}x ({mine['qps']:.3f} against {theirs['qps']:.3f} QPS in simulation; "
        f"{record})"
    )


def placement(config: dict, builds_on: dict | None) -> str:
    """DistServe's question for a disaggregated layout: which placement the predictions pick, its
    prefill and decode workers or the colocated engine it builds on (the same cores or GPUs), and
    what the two measured capacities say beside it; "" for any other configuration."""
    split = (config.get("engine") or {}).get("disaggregation")
    if not split or builds_on is None:
        return ""
    mine, theirs = config["predicted"].get("qps"), builds_on["predicted"].get("qps")
    if not mine or not theirs:
        return ""
    workers = f"{split.get('prefill', 1)} prefill + {split.get('decode', 1)} decode workers"
    picked = workers if mine > theirs else f"colocated ({builds_on['label']})"
    measured = (
        f"measured {config['capacity_qps']:.3f} against {builds_on['capacity_qps']:.3f}"
        if config["capacity_qps"] and builds_on["capacity_qps"]
        else "not both measured"
    )
    return (
        f"placement: the prediction picks {picked} ({mine:.3f} QPS for {workers} against {theirs:.3f} "
        f"colocated; {measured})"
    )


def configurations(
    top: Path, plan: dict, runs: dict[Path, RunLogs], targets, price, prompts, references, tokenizer
) -> list[dict]:
    """Each configuration of an ablation's plan with its Offline run, its search and its figures."""
    peaks = json.loads((top / PEAKS).read_text()) if (top / PEAKS).is_file() else None
    out = []
    for config in plan["configs"]:
        folder = top / config["folder"]
        offline = runs.get(folder / "offline")
        if offline is None:
            raise RunLogError(f"{folder}: no Offline run (offline/) for the configuration {config['label']!r}")
        search = json.loads((folder / "capacity.json").read_text())
        low = [search["low_load"]] if search.get("low_load") else []  # goodput well below capacity
        trials = [(runs[top / t["logs"]], t) for t in search["trials"] + low]
        exact = not config["folder"].startswith(NUMERICS_FOLDER)
        trial_figs = [
            (run, figures_for(run, config["label"], targets, price, prompts, peaks, exact)) for run, _ in trials
        ]
        at = next(  # the run that met the targets at the capacity (a rate run twice may have failed once)
            (fig for (_, t), (_, fig) in zip(trials, trial_figs) if t["qps"] == search["capacity_qps"] and t["passed"]),
            None,
        )
        if at is None and search["capacity_qps"] is not None:
            raise RunLogError(f"{folder}: capacity.json names {search['capacity_qps']} QPS, but no trial passed at it")
        off = figures_for(offline, config["label"], targets, price, prompts, peaks, exact)
        off.quality = quality(offline, references, tokenizer) if tokenizer else {}
        out.append(
            {
                **{k: config[k] for k in ("label", "change", "builds_on", "folder", "engine")},
                "note": config.get("note", ""),  # a plan from before the notes has none
                "offline": asdict(off),
                "capacity_qps": search["capacity_qps"],
                "failed_qps": search["failed_qps"],
                "start_qps": search["start_qps"],
                "search_summary": search["summary"],
                "at_capacity": asdict(at) if at else None,
                "trials": [asdict(fig) for _, fig in sorted(trial_figs, key=lambda t: t[1].target_qps)],
                "cost_by_tpot": cost_by_tpot_target(trial_figs, targets[0], targets[1], price, prompts),
                "predicted": search.get("predicted") or {"qps": None, "why_not": "its runs predate predictions"},
            }
        )
    base = out[0] if out else None
    for c in out:
        c["quality"] = c["offline"]["quality"]
        c["quality_change"] = {
            k: 100 * (c["quality"][k] - base["quality"][k]) / base["quality"][k]
            for k in QUALITY_METRICS
            if c["quality"] and base["quality"].get(k)
        }
        c["meets_quality_target"] = (
            all(c["quality"][k] >= QUALITY_TARGET * base["quality"][k] for k in QUALITY_METRICS)
            if c["quality"] and base["quality"]
            else None
        )
        at, base_at = c["at_capacity"] or {}, base["at_capacity"] or {}
        c["ratios"] = {
            "offline_tokens_per_s": ratio(c["offline"]["tokens_per_s"], base["offline"]["tokens_per_s"]),
            "capacity_qps": ratio(c["capacity_qps"], base["capacity_qps"]),
            "cost_per_m_input": ratio(at.get("cost_per_m_input"), base_at.get("cost_per_m_input")),
            "cost_per_m_output": ratio(at.get("cost_per_m_output"), base_at.get("cost_per_m_output")),
        }
    for c in out:
        predicted, measured = c["predicted"].get("qps"), c["capacity_qps"]
        c["prediction_error"] = measured / predicted - 1 if predicted and measured else None
        again = (c["predicted"].get("reanchored") or {}).get("qps")
        c["reanchored_error"] = measured / again - 1 if again and measured else None
    errors = [abs(c["prediction_error"]) for c in out if c["prediction_error"] is not None]
    reanchored = [abs(c["reanchored_error"]) for c in out if c["reanchored_error"] is not None]
    by_label = {c["label"]: c for c in out}
    for c in out:
        c["verdict"] = verdict(c, by_label.get(c["builds_on"]), plan.get("capacity_spread", 0.0))
        said = predicted_verdict(c, by_label.get(c["builds_on"]), errors, reanchored)
        if said:
            c["verdict"] += f"; {said}"
        placed = placement(c, by_label.get(c["builds_on"]))
        if placed:
            c["verdict"] += f"; {placed}"
        on = by_label.get(c["builds_on"])
        c["quality_change_on_builds_on"] = {
            k: 100 * (c["quality"][k] - on["quality"][k]) / on["quality"][k]
            for k in QUALITY_METRICS
            if on is not None and c["quality"] and on["quality"].get(k)
        }
    return out


def build(
    folders: list[Path],
    out: Path,
    targets: tuple[float, float] | None = None,
    price: float | None = None,
    root: Path = REPO,
    log=print,
    spread: float | None = None,
) -> dict:
    """Read the runs, compute their figures, write the page and its Markdown; return the report's data.
    `spread`: the machine's run-to-run spread of a capacity for the verdicts, in place of the one the
    runs were made with (their plan's report.capacity_spread), where it has been measured since."""
    found = []
    for top in folders:
        if not top.is_dir():
            raise RunLogError(f"{top}: not a folder")
        paths = sorted({p.parent for name in (DETAIL_LOG, REPLAY_LOG) for p in top.rglob(name)})
        if not paths:
            raise RunLogError(f"{top}: no LoadGen run under it (no {DETAIL_LOG})")
        found += [(top, path) for path in paths]
    runs = {path: read_run(path) for _, path in found}
    record = next((run.record for run in runs.values() if run.record), {})
    benchmark = BENCHMARKS.get(record.get("benchmark", ""))
    planned = [json.loads((top / PLAN).read_text()) for top in folders if (top / PLAN).is_file()]
    if targets is None and planned and "targets_ms" in planned[0]:  # what the searches met
        targets = tuple(planned[0]["targets_ms"])
    if targets is None:
        if benchmark is None or SCENARIO not in benchmark.latency_limits_ms:
            raise RunLogError("the runs do not name a benchmark with Server limits: give --ttft-ms and --tpot-ms")
        targets = tuple(benchmark.latency_limits_ms[SCENARIO])
    price_note = ""
    if price is None and record.get("system"):
        try:
            settings = report_settings(System.load(record["system"], root), record.get("benchmark", ""))
            price, price_note = settings.get("price_per_hour"), settings.get("price_note", "")
        except (SystemConfigError, HarnessConfigError):
            pass
    dataset, tokenizer, notes = None, None, []
    if record.get("dataset"):
        try:
            dataset = load_dataset(record["dataset"])
        except DatasetError as e:
            log(f"report: no input token counts or quality: {e}")
    if dataset is not None and record.get("model"):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(record["model"])
    prompts = dataset and dataset.input_ids
    references = dataset.references if dataset is not None else []
    configs, traffic, peaks, used_spread = [], None, None, spread
    for top in folders:
        if (top / PLAN).is_file():
            plan = json.loads((top / PLAN).read_text())
            if spread is not None:
                plan["capacity_spread"] = spread
            configs += configurations(top, plan, runs, targets, price, prompts, references, tokenizer)
            traffic = plan.get("traffic") or traffic
            used_spread = plan.get("capacity_spread", 0.0)  # as the verdicts took it
        if (top / PEAKS).is_file():
            peaks = json.loads((top / PEAKS).read_text())
    notes += [f"{c['label']}: {c['note']}" for c in configs if c.get("note")]
    figs = []
    for top, path in found:
        run = runs[path]
        fig = figures_for(run, str(path.relative_to(top)) if path != top else path.name, targets, price, prompts, peaks)
        if run.scenario == SCENARIO and fig.goodput_qps is None:
            notes.append(
                f"{fig.label}: LoadGen's accuracy log lacks some responses (a submission's performance run logs "
                "none; the report's runs log all: harness run --log-responses), so its goodput and cost are not given"
            )
        figs.append(fig)
    if not configs:  # runs without an ablation's plan: each one's quality
        for fig, (_, path) in zip(figs, found):
            fig.quality = quality(runs[path], references, tokenizer) if tokenizer else {}
    report = {
        "method": __doc__.split("Where each figure comes from (the page says it too):\n", 1)[1].strip(),
        "quality_metrics": list(QUALITY_METRICS),
        "quality_target": QUALITY_TARGET,
        "targets_ms": {"ttft": targets[0], "tpot": targets[1]},
        "price_per_hour": price,
        "price_note": price_note,
        "notes": notes,
        "traffic": traffic,
        "peaks": peaks,
        "capacity_spread": used_spread,
        "configurations": configs,
        "figures": [asdict(f) for f in figs],
        "runs": [
            {
                "folder": str(path),
                "record": runs[path].record,
                "loadgen": {
                    k: runs[path].detail.get(k)
                    for k in ("effective_min_query_count", "effective_sample_concatenate_permutation")
                },
            }
            for _, path in found
        ],
        "total_samples": len(dataset) if dataset is not None else None,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    write_page(report, out)
    return report


def headline(report: dict) -> str:
    """One line: each configuration's capacity and its ratio to the first (or the runs' count)."""
    if not report["configurations"]:
        return f"{len(report['figures'])} runs, no ablation plan among them"

    def one(c):
        if c["capacity_qps"] is None:
            return f"{c['label']} none"
        times = c["ratios"]["capacity_qps"]
        return f"{c['label']} {c['capacity_qps']:.3f}" + (f" ({times:.2f}x)" if times else "")

    return "capacity (QPS): " + "; ".join(one(c) for c in report["configurations"])


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m harness.measure.report", description=__doc__.split("\n\n")[0])
    parser.add_argument("--system", default="cpu-demo")
    parser.add_argument("--benchmark", default="llama3.1-8b")
    parser.add_argument("--logs", type=Path, nargs="+", help="build the page from these runs' folders (no runs)")
    parser.add_argument("--out", type=Path, default=report_dir(REPO))
    parser.add_argument(
        "--traffic",
        type=Path,
        help="a traffic sample (JSON Lines: prompt, output length or reference, arrival time; "
        "harness/measure/traffic.py) in place of the benchmark's dataset",
    )
    parser.add_argument("--root", type=Path, default=REPO, help="the folder holding systems/ and measurements/")
    parser.add_argument(
        "--scenario",
        default="Server",
        help="whose latency limits the searches meet and whose engine settings the configurations take "
        "(Server, or Interactive)",
    )
    parser.add_argument(
        "--ttft-ms", type=float, help="the TTFT target of the searches and of goodput (default: the scenario's limit)"
    )
    parser.add_argument(
        "--tpot-ms", type=float, help="the TPOT target of the searches and of goodput (default: the scenario's limit)"
    )
    parser.add_argument(
        "--configurations",
        help="comma-separated words: run only the configurations whose labels contain one (e.g. "
        "'int16,replicas,disaggregated')",
    )
    parser.add_argument("--budget-min", type=float, help="the runs' budget in minutes (default: the system file's)")
    parser.add_argument(
        "--price-per-hour", type=float, help="per accelerator- or machine-hour (default: the system file's)"
    )
    parser.add_argument(
        "--capacity-spread",
        type=float,
        help="with --logs: the machine's run-to-run spread of a capacity for the verdicts (a fraction), in "
        "place of the one the runs were made with",
    )
    args = parser.parse_args()
    if (args.ttft_ms is None) != (args.tpot_ms is None):
        sys.exit("error: report: give both --ttft-ms and --tpot-ms, or neither")
    targets = (args.ttft_ms, args.tpot_ms) if args.ttft_ms is not None else None
    try:
        folders = args.logs
        if folders is None:
            runs_dir = args.out / "runs"
            run_configurations(
                args.system,
                args.benchmark,
                runs_dir,
                args.root,
                traffic=args.traffic,
                scenario=args.scenario,
                targets=targets,
                only=args.configurations.split(",") if args.configurations else None,
                budget_min=args.budget_min,
            )
            folders = [runs_dir]
        if args.capacity_spread is not None and (args.logs is None or args.capacity_spread < 0):
            raise HarnessConfigError("--capacity-spread is a fraction >= 0, for a page rebuilt with --logs")
        report = build(folders, args.out, targets, args.price_per_hour, args.root, spread=args.capacity_spread)
    except (HarnessConfigError, RunLogError, DatasetError, SystemConfigError, CapacityError) as e:
        sys.exit(f"error: report: {e}")
    print(f"report: {args.out / 'report.html'} ({len(report['figures'])} runs); {headline(report)}")


if __name__ == "__main__":
    main()
