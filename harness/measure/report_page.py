"""The report's page: report.html (self-contained: its plots embedded as PNG data) and report.md
(the same tables, the plots beside it as files), from the data harness/measure/report.py computed."""

import base64
import html
import io
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

# Engine settings shown as the runs' limits where they are set.
LIMITS = (
    "max_num_seqs",
    "max_num_batched_tokens",
    "max_model_len",
    "num_kv_blocks",
    "kv_cache_memory_gb",
    "data_parallel_size",
    "tensor_parallel_size",
)


def _num(value, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _pair(a, b, digits: int) -> str:
    return f"{_num(a, digits)} / {_num(b, digits)}"


def _times(value) -> str:
    return "" if value is None else f" ({value:.2f}x)"


def _goodput(f: dict | None) -> str:
    if not f or f["goodput_qps"] is None:
        return "n/a"
    return f"{f['goodput_qps']:.3f} ({f['good_queries']}/{f['queries']})"


def _quality(c: dict, metric: str) -> str:
    if metric not in c["quality"]:
        return "n/a"
    change = c.get("quality_change", {}).get(metric)
    return f"{c['quality'][metric]:.4f}" + ("" if change is None else f" ({change:+.2f}%)")


def _quality_on_builds_on(c: dict, metrics: list[str]) -> str:
    """Each metric's change against the configuration `c` builds on (n/a where that one is not in the report)."""
    changes = c.get("quality_change_on_builds_on") or {}
    if not changes:
        return "n/a"
    return ", ".join(f"{m} {changes[m]:+.2f}%" for m in metrics if m in changes)


def _capacity(c: dict) -> str:
    if c["capacity_qps"] is None:
        return "none"
    above = f"; {c['failed_qps']:.3f} failed" if c["failed_qps"] is not None else "; none failed"
    return f"{c['capacity_qps']:.3f}{_times(c['ratios']['capacity_qps'])}{above}"


def _predicted(c: dict) -> str:
    p = c["predicted"]
    if not p.get("qps"):
        return f"none ({p.get('why_not') or 'no rate met the targets in simulation'})"
    error = f"; measured {c['prediction_error']:+.0%}" if c["prediction_error"] is not None else ""
    again = (p.get("reanchored") or {}).get("qps")
    if again:
        error += f"; re-anchored on its first trial {again:.3f}"
        if c.get("reanchored_error") is not None:
            error += f", measured {c['reanchored_error']:+.0%}"
    return f"{p['qps']:.3f} ({p['low'] or 0:.3f}-{p['high'] or 0:.3f}{error})"


def _axis(ax, xlabel: str, ylabel: str, title: str | None = None) -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.grid(alpha=0.3)


def tables(report: dict) -> list[tuple[str, str, list[str], list[list[str]]]]:
    """(id, title, header, rows) of each table on the page."""
    configs, figs = report["configurations"], report["figures"]
    t = report["targets_ms"]
    price = report["price_per_hour"]
    out = []
    if configs:
        base = configs[0]["label"]
        out.append(
            (
                "headline",
                f"Configurations at their capacity (TTFT <= {t['ttft']:g} ms, TPOT <= {t['tpot']:g} ms at p99; "
                f"ratios against {base}; a verdict needs the brackets apart by the run-to-run spread of "
                f"{report.get('capacity_spread') or 0:.0%} set for this machine)",
                [
                    "configuration",
                    "builds on",
                    "change",
                    "Offline tokens/s",
                    "capacity (QPS; the rate that failed above it)",
                    "tokens/s at capacity",
                    "TTFT p50 / p99 (ms)",
                    "TPOT p50 / p99 (ms)",
                    "goodput (q/s)",
                    "$ / M input",
                    "$ / M output",
                    "rouge1 (change)",
                    "against what it builds on",
                    "predicted capacity (QPS; band; measured against it)",
                ],
                [
                    [
                        c["label"],
                        c["builds_on"] or "",
                        c["change"],
                        _num(c["offline"]["tokens_per_s"]) + _times(c["ratios"]["offline_tokens_per_s"]),
                        _capacity(c),
                        _num((c["at_capacity"] or {}).get("tokens_per_s")),
                        _pair(
                            (c["at_capacity"] or {}).get("ttft_p50_ms"), (c["at_capacity"] or {}).get("ttft_p99_ms"), 0
                        ),
                        _pair(
                            (c["at_capacity"] or {}).get("tpot_p50_ms"), (c["at_capacity"] or {}).get("tpot_p99_ms"), 1
                        ),
                        _goodput(c["at_capacity"]),
                        _num((c["at_capacity"] or {}).get("cost_per_m_input"), 4)
                        + _times(c["ratios"]["cost_per_m_input"]),
                        _num((c["at_capacity"] or {}).get("cost_per_m_output"), 4)
                        + _times(c["ratios"]["cost_per_m_output"]),
                        _quality(c, "rouge1"),
                        c["verdict"],
                        _predicted(c),
                    ]
                    for c in configs
                ],
            )
        )
        out.append(
            (
                "searches",
                "Capacity searches: every trial (LoadGen Server runs, judged by LoadGen's p99 check), and "
                "each configuration's trial at half its capacity",
                [
                    "configuration",
                    "arrival rate (q/s)",
                    "queries",
                    "p99s met",
                    "TTFT p50 / p99 (ms)",
                    "TPOT p50 / p99 (ms)",
                    "completed (q/s)",
                    "goodput (q/s)",
                    "tokens/s",
                ],
                [
                    [
                        c["label"],
                        _num(f["target_qps"], 3),
                        str(f["queries"]),
                        {True: "yes", False: "NO", None: "n/a"}[f["p99s_met"]],
                        _pair(f["ttft_p50_ms"], f["ttft_p99_ms"], 0),
                        _pair(f["tpot_p50_ms"], f["tpot_p99_ms"], 1),
                        _num(f["completed_qps"], 3),
                        _goodput(f),
                        _num(f["tokens_per_s"]),
                    ]
                    for c in configs
                    for f in c["trials"]
                ]
                + [[c["label"], "", "", "", "", "", "", "", c["search_summary"]] for c in configs],
            )
        )
        metrics = report["quality_metrics"]
        out.append(
            (
                "quality",
                f"Quality of each configuration's Offline responses (changes against {base}; its target "
                f"{report['quality_target']:.0%} of {base}'s)",
                [
                    "configuration",
                    "samples",
                    *metrics,
                    "tokens per sample",
                    "builds on",
                    "change against what it builds on",
                    f"meets {report['quality_target']:.0%}",
                    "note",
                ],
                [
                    [
                        c["label"],
                        str(c["offline"]["queries"]),
                        *(_quality(c, m) for m in metrics),
                        _num(c["quality"].get("tokens_per_sample")),
                        c["builds_on"] or "",
                        _quality_on_builds_on(c, metrics),
                        {True: "yes", False: "NO", None: "n/a"}[c.get("meets_quality_target")],
                        c.get("note", ""),
                    ]
                    for c in configs
                ],
            )
        )
        out.append(
            (
                "cost",
                "Cost at the capacity" + (f", at {price:g} per hour" if price else " (no price given)"),
                [
                    "configuration",
                    "run length (s)",
                    "input tokens within targets",
                    "output tokens within targets",
                    "prefill share of busy time",
                    "$ / M input",
                    "$ / M output",
                ],
                [
                    [
                        c["label"],
                        _num(a.get("duration_s")),
                        str(a.get("input_tokens")),
                        str(a.get("output_tokens")),
                        _num(a.get("prefill_share"), 3),
                        _num(a.get("cost_per_m_input"), 4),
                        _num(a.get("cost_per_m_output"), 4),
                    ]
                    for c in configs
                    for a in [c["at_capacity"] or {}]
                ],
            )
        )
        peaks = report.get("peaks")
        if peaks:
            out.append(
                (
                    "bound",
                    f"Against the hardware's bound ({peaks['bandwidth_gbps']:.1f} GB/s, "
                    f"{peaks['flops_tflops'] * 1e3:.0f} GFLOP/s measured here)",
                    [
                        "configuration",
                        "run",
                        "engine busy (s)",
                        "bound (s)",
                        "bound by",
                        "GB read, at least",
                        "GFLOP, at least",
                        "bound / busy",
                    ],
                    [
                        [
                            c["label"],
                            run,
                            _num(b["busy_s"], 2),
                            _num(b["bound_s"], 2),
                            b["bound_by"],
                            _num(b["gb_read"], 1),
                            _num(b["gflop"], 1),
                            "n/a" if b["share_of_bound"] is None else f"{b['share_of_bound']:.0%}",
                        ]
                        for c in configs
                        for run, f in (("Offline", c["offline"]), ("at the capacity", c["at_capacity"]))
                        if f and (b := f["bound"])
                    ],
                )
            )
        targets = [p["tpot_ms"] for p in configs[0]["cost_by_tpot"]]
        out.append(
            (
                "tpot_targets",
                "Cost per million output tokens against the p99 TPOT target (the highest trial rate meeting it)",
                ["configuration", *(f"TPOT <= {x:g} ms" for x in targets)],
                [
                    [
                        c["label"],
                        *(
                            "n/a" if p["qps"] is None else f"{_num(p['cost_per_m_output'], 4)} at {p['qps']:.3f} q/s"
                            for p in c["cost_by_tpot"]
                        ),
                    ]
                    for c in configs
                ],
            )
        )
    out.append(
        (
            "runs",
            "Runs and their conditions",
            [
                "run",
                "scenario",
                "date",
                "commit",
                "queries",
                "target q/s",
                "LoadGen verdict",
                "TTFT p50 / p99 (ms)",
                "TPOT p50 / p99 (ms)",
                "tokens/s",
                "goodput (q/s)",
                "$ / M input",
                "$ / M output",
                "rouge1",
                "engine limits",
                "engine settings",
            ],
            [
                [
                    f["label"],
                    f["scenario"],
                    run["record"].get("date", "unknown"),
                    run["record"].get("commit", "unknown"),
                    str(f["queries"]),
                    _num(f["target_qps"], 3),
                    f["validity"] or "",
                    _pair(f["ttft_p50_ms"], f["ttft_p99_ms"], 0),
                    _pair(f["tpot_p50_ms"], f["tpot_p99_ms"], 1),
                    _num(f["tokens_per_s"]),
                    _goodput(f),
                    _num(f["cost_per_m_input"], 4),
                    _num(f["cost_per_m_output"], 4),
                    _num(f["quality"].get("rouge1"), 4),
                    _limits(run["record"]),
                    json.dumps(run["record"].get("engine", {}), sort_keys=True),
                ]
                for run, f in zip(report["runs"], figs)
            ],
        )
    )
    return out


def _limits(record: dict) -> str:
    engine = {**record.get("engine", {}), "max_model_len": record.get("max_model_len")}
    return ", ".join(f"{k} {engine[k]}" for k in LIMITS if engine.get(k) is not None) or "unknown"


def conditions(report: dict) -> list[tuple[str, str]]:
    """What every number on the page was measured under: one value where the runs share it."""
    records = [run["record"] for run in report["runs"]]

    def shared(key, default="unknown"):
        values = sorted({str(r.get(key) or default) for r in records})
        return values[0] if len(values) == 1 else "per run (below): " + "; ".join(values)

    queries = sorted({f["queries"] for f in report["figures"]})
    total = report["total_samples"] or "unknown"
    if report["configurations"]:
        offline = sorted({c["offline"]["queries"] for c in report["configurations"]})
        used = (
            f"{', '.join(map(str, offline))} of its {total} samples in each Offline run, each once; each capacity "
            "trial its queries, each a different sample (LoadGen's equal issue), the same seeds in every run"
        )
    else:
        used = f"{', '.join(map(str, queries))} queries per run, of its {total} samples"
    traffic = report.get("traffic")
    if traffic:
        interval = traffic["mean_interval_s"]
        used += f"; a user's traffic sample, {traffic['file']}, converted (harness/measure/traffic.py). " + (
            f"Its arrival times (a mean interval of {interval:.3f} s, {1 / interval:.3f} q/s as sampled) are "
            "replayed, scaled to each trial's mean rate (harness/measure/replay.py; LoadGen follows no schedule but "
            "Poisson arrivals), so the trials' latencies are the harness's, timed from each request's "
            "scheduled arrival as LoadGen times them"
            if interval
            else "It has no arrival times: LoadGen draws Poisson arrivals at each trial's rate"
        )
    return [
        ("model", f"{shared('model_name', 'the folder')} ({shared('model')})"),
        ("dtype", shared("dtype")),
        ("hardware", shared("machine")),
        ("benchmark, scenarios", f"{shared('benchmark')}, LoadGen {shared('scenario')}"),
        (
            "dataset",
            f"{shared('dataset')}: {used}",
        ),
        ("latency targets", f"TTFT {report['targets_ms']['ttft']:g} ms, TPOT {report['targets_ms']['tpot']:g} ms"),
        (
            "price",
            f"{report['price_per_hour']:g} per hour" + (f" ({report['price_note']})" if report["price_note"] else "")
            if report["price_per_hour"]
            else "none given: no costs",
        ),
        (
            "date",
            " to ".join(sorted({dates[0], dates[-1]}))
            if (dates := sorted(r.get("date", "unknown") for r in records))
            else "unknown",
        ),
        ("commit", shared("commit")),
        (
            "the machine's peaks",
            f"{p['bandwidth_gbps']:.1f} GB/s, {p['flops_tflops'] * 1e3:.0f} GFLOP/s ({p['method']})"
            if (p := report.get("peaks"))
            else "not measured",
        ),
    ]


def plots(report: dict) -> dict[str, bytes]:
    """name -> PNG bytes: per configuration (or, without an ablation, per Server run)."""
    configs, t = report["configurations"], report["targets_ms"]
    server = [f for f in report["figures"] if f["scenario"] == "Server"]
    out = {}
    if configs:
        out["capacity"] = capacity_chart(configs)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    top = 0.0
    for c in configs:
        trials = [f for f in c["trials"] if f["goodput_qps"] is not None]
        ax.plot([f["target_qps"] for f in trials], [f["goodput_qps"] for f in trials], "o-", label=c["label"])
        top = max([top, *(f["target_qps"] for f in trials)])
    if not configs:
        points = sorted((f for f in server if f["goodput_qps"] is not None), key=lambda f: f["target_qps"])
        ax.plot([f["target_qps"] for f in points], [f["goodput_qps"] for f in points], "o-", label="goodput")
        top = max([top, *(f["target_qps"] for f in points)])
    ax.plot([0, top], [0, top], color="gray", linestyle=":", label="arrival rate")
    _axis(ax, "arrival rate (q/s)", "goodput (q/s within both targets)", "Goodput against arrival rate")
    ax.legend(fontsize=7)
    out["goodput_rate"] = _png(fig)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for c in configs:
        points = [p for p in c["cost_by_tpot"] if p["cost_per_m_output"] is not None]
        ax.plot([p["tpot_ms"] for p in points], [p["cost_per_m_output"] for p in points], "o-", label=c["label"])
    ax.axvline(t["tpot"], color="gray", linestyle="--", label=f"the benchmark's {t['tpot']:g} ms")
    _axis(ax, "p99 TPOT target (ms)", "$ per million output tokens", "Cost against the TPOT target")
    ax.legend(fontsize=7)
    out["cost_tpot"] = _png(fig)

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    at = [(c["label"], c["at_capacity"]) for c in configs if c["at_capacity"]] or [(f["label"], f) for f in server]
    for label, f in at:
        for ax, values in zip(axes, (f["ttfts_ms"], f["tpots_ms"])):
            ordered = sorted(values)
            ax.step(ordered, [(i + 1) / len(ordered) for i in range(len(ordered))], where="post", label=label)
    for ax, name, target in zip(axes, ("TTFT", "TPOT"), (t["ttft"], t["tpot"])):
        ax.axvline(target, color="gray", linestyle="--", label=f"target {target:g} ms")
        _axis(ax, f"{name} (ms)", "share of queries", f"{name} per query at the capacity (CDF)")
    axes[1].legend(fontsize=7)
    out["latency_cdf"] = _png(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    scored = [c for c in configs if "rouge1" in c["quality"]]
    for c in scored:
        ax.scatter(c["capacity_qps"] or 0, c["quality"]["rouge1"], label=c["label"])
    if scored:
        ax.axhline(
            report["quality_target"] * scored[0]["quality"]["rouge1"],
            color="gray",
            linestyle="--",
            label=f"{report['quality_target']:.0%} of {scored[0]['label']}",
        )
    _axis(ax, "capacity (q/s)", "rouge1", "Quality against capacity")
    if scored:
        ax.legend(fontsize=7)
    out["quality_capacity"] = _png(fig)
    return out


def capacity_chart(configs: list[dict]) -> bytes:
    """Every configuration's capacity: measured (the rate that passed, a line to the rate that failed
    above it; where none passed, a cross at the lowest that failed) and predicted (hollow, a line
    across its band; a diamond where re-anchored on its first trial's steps), one row each."""
    fig, ax = plt.subplots(figsize=(8, 0.5 * len(configs) + 1.5))
    for row, c in enumerate(reversed(configs)):
        if c["capacity_qps"] is not None:
            top = c["failed_qps"] or c["capacity_qps"]
            ax.plot([c["capacity_qps"], top], [row + 0.12] * 2, color="C0", linewidth=3)
            ax.plot(c["capacity_qps"], row + 0.12, "o", color="C0", label="measured (to the rate failed above)")
        elif c["failed_qps"] is not None:
            ax.plot(c["failed_qps"], row + 0.12, "x", color="C3", label="no rate met the targets (the lowest failed)")
        p = c["predicted"]
        if p.get("qps"):
            ax.plot([p["low"] or p["qps"], p["high"] or p["qps"]], [row - 0.12] * 2, color="C1", linewidth=1.5)
            ax.plot(p["qps"], row - 0.12, "o", mfc="none", color="C1", label="predicted (its band)")
        again = (p.get("reanchored") or {}).get("qps")
        if again:
            ax.plot(again, row - 0.12, "d", mfc="none", color="C2", label="predicted, re-anchored on its first trial")
    ax.set_yticks(range(len(configs)), [c["label"] for c in reversed(configs)], fontsize=8)
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    if unique:
        ax.legend(unique.values(), unique.keys(), fontsize=7)
    _axis(ax, "capacity at the latency targets (q/s)", "", "Capacity of each configuration")
    return _png(fig)


def _png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png", dpi=90)
    plt.close(fig)
    return buffer.getvalue()


def write_page(report: dict, out: Path) -> None:
    images = plots(report)
    for name, data in images.items():
        (out / f"{name}.png").write_bytes(data)
    title = "Saaf Infer measurement report"
    worth = [(c["label"], c["verdict"]) for c in report["configurations"][1:]]
    md = [f"# {title}", ""]
    if "capacity" in images:
        md += ["![capacity](capacity.png)", ""]
    md += [f"- **{label}**: {verdict}" for label, verdict in worth]
    md += ["", "## Conditions", ""] + [f"- **{k}**: {v}" for k, v in conditions(report)]
    md += [f"- note: {n}" for n in report["notes"]]
    for _, caption, header, rows in tables(report):
        md += ["", f"## {caption}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        md += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    md += ["", "## Plots", ""] + [f"![{name}]({name}.png)" for name in images if name != "capacity"]
    md += ["", "## How each figure is computed", "", report["method"], ""]
    (out / "report.md").write_text("\n".join(md) + "\n")

    e = html.escape
    body = [f"<h1>{e(title)}</h1>"]
    if "capacity" in images:
        body.append(f"<img alt='capacity' src='data:image/png;base64,{base64.b64encode(images['capacity']).decode()}'>")
    body += ["<ul class='worth'>"] + [f"<li><b>{e(label)}</b>: {e(verdict)}</li>" for label, verdict in worth]
    body += ["</ul>", "<h2>Conditions</h2>", "<table class='conditions'>"]
    body += [f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in conditions(report)]
    body += ["</table>"]
    body += [f"<p class='note'>{e(n)}</p>" for n in report["notes"]]
    for table_id, caption, header, rows in tables(report):
        body += [
            f"<h2>{e(caption)}</h2>",
            f"<table id='{table_id}'>",
            "<tr>" + "".join(f"<th>{e(h)}</th>" for h in header) + "</tr>",
        ]
        body += ["<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in rows]
        body.append("</table>")
    body.append("<h2>Plots</h2>")
    body += [
        f"<img alt='{name}' src='data:image/png;base64,{base64.b64encode(data).decode()}'>"
        for name, data in images.items()
        if name != "capacity"
    ]
    body += ["<h2>How each figure is computed</h2>", f"<pre>{e(report['method'])}</pre>"]
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{e(title)}</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:1400px}} table{{border-collapse:collapse;margin:1em 0}}
td,th{{border:1px solid #ccc;padding:3px 6px;font-size:13px;text-align:left;vertical-align:top}}
pre{{white-space:pre-wrap;font-size:12px}} img{{display:block;margin:1em 0;max-width:100%}}</style>
<script>
// Every image counted once the page has loaded (the test that renders the page reads these).
window.addEventListener("load", () => {{
  const images = Array.from(document.images);
  document.body.dataset.imagesTotal = images.length;
  document.body.dataset.imagesLoaded = images.filter(i => i.complete && i.naturalWidth > 0).length;
}});
</script></head>
<body>
{chr(10).join(body)}
</body></html>
"""
    (out / "report.html").write_text(page)
