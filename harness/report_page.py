"""The report's page: report.html (self-contained: its plots embedded as PNG data) and report.md
(the same tables, the plots beside it as files), from the data harness/report.py computed."""

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


def _goodput(f: dict) -> str:
    if f["goodput_qps"] is None:
        return "n/a"
    return f"{f['goodput_qps']:.3f} ({f['good_queries']}/{f['queries']})"


def _quality(f: dict, metric: str) -> str:
    if metric not in f["quality"]:
        return "n/a"
    change = f["quality_change"].get(metric)
    return f"{f['quality'][metric]:.4f}" + ("" if change is None else f" ({change:+.2f}%)")


def _ablation(figs: list[dict]) -> list[dict]:
    return [f for f in figs if f["kind"] != "sweep"]


def _sweep(figs: list[dict]) -> list[dict]:
    """The load sweep's points (the ablation's run of the system's settings among them), by rate."""
    return sorted((f for f in figs if f["in_sweep"]), key=lambda f: f["target_qps"])


def _axis(ax, xlabel: str, ylabel: str, title: str | None = None) -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.grid(alpha=0.3)


def tables(report: dict) -> list[tuple[str, str, list[str], list[list[str]]]]:
    """(id, title, header, rows) of each table on the page."""
    figs = report["figures"]
    ablation, sweep = _ablation(figs), _sweep(figs)
    t = report["targets_ms"]
    price = report["price_per_hour"]
    headline = (
        "headline",
        "Configurations",
        [
            "configuration",
            "builds on",
            "change",
            "TTFT p50 / p99 (ms)",
            "TPOT p50 / p99 (ms)",
            "tokens/s",
            f"goodput (q/s; TTFT <= {t['ttft']:g} ms, TPOT <= {t['tpot']:g} ms)",
            "$ / M input",
            "$ / M output",
            "rouge1 (change)",
            "rougeL (change)",
            f">= {report['quality_target']:.0%} of first",
        ],
        [
            [
                f["label"],
                f["builds_on"] or "",
                f["change"],
                _pair(f["ttft_p50_ms"], f["ttft_p99_ms"], 0),
                _pair(f["tpot_p50_ms"], f["tpot_p99_ms"], 1),
                _num(f["tokens_per_s"]),
                _goodput(f),
                _num(f["cost_per_m_input"], 4),
                _num(f["cost_per_m_output"], 4),
                _quality(f, "rouge1"),
                _quality(f, "rougeL"),
                {True: "yes", False: "NO", None: "n/a"}[f["meets_quality_target"]],
            ]
            for f in ablation
        ],
    )
    out = [headline]
    if len(sweep) > 1:
        out.append(
            (
                "sweep",
                "Load sweep (the system's own settings)",
                [
                    "arrival rate (q/s)",
                    "completed (q/s)",
                    "tokens/s",
                    "TTFT p50 / p99 (ms)",
                    "TPOT p50 / p99 (ms)",
                    "goodput (q/s)",
                ],
                [
                    [
                        _num(f["target_qps"], 3),
                        _num(f["completed_qps"], 3),
                        _num(f["tokens_per_s"]),
                        _pair(f["ttft_p50_ms"], f["ttft_p99_ms"], 0),
                        _pair(f["tpot_p50_ms"], f["tpot_p99_ms"], 1),
                        _goodput(f),
                    ]
                    for f in sweep
                ],
            )
        )
    out.append(
        (
            "quality",
            "Quality of each run's own responses",
            ["configuration", *report["quality_metrics"], "tokens per sample"],
            [
                [
                    f["label"],
                    *(_quality(f, m) for m in report["quality_metrics"]),
                    _num(f["quality"].get("tokens_per_sample")),
                ]
                for f in ablation
            ],
        )
    )
    out.append(
        (
            "cost",
            "Cost split" + (f" at {price:g} per hour" if price else " (no price given)"),
            [
                "configuration",
                "run length (s)",
                "input tokens",
                "output tokens",
                "prefill share of busy time",
                "$ / M input",
                "$ / M output",
            ],
            [
                [
                    f["label"],
                    _num(f["duration_s"]),
                    str(f["input_tokens"]),
                    str(f["output_tokens"]),
                    _num(f["prefill_share"], 3),
                    _num(f["cost_per_m_input"], 4),
                    _num(f["cost_per_m_output"], 4),
                ]
                for f in figs
            ],
        )
    )
    out.append(
        (
            "runs",
            "Runs and their conditions",
            [
                "run",
                "folder",
                "date",
                "commit",
                "queries",
                "target q/s",
                "LoadGen verdict",
                "engine limits",
                "engine settings",
            ],
            [
                [
                    run["label"],
                    run["folder"],
                    run["record"].get("date", "unknown"),
                    run["record"].get("commit", "unknown"),
                    str(f["queries"]),
                    _num(run["loadgen"]["effective_target_qps"], 3),
                    run["validity"] or "",
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

    figs = report["figures"]
    queries = sorted({f["queries"] for f in figs})
    total = report["total_samples"]
    return [
        ("model", f"{shared('model_name', 'the folder')} ({shared('model')})"),
        ("dtype", shared("dtype")),
        ("hardware", shared("machine")),
        ("benchmark, scenario", f"{shared('benchmark')}, LoadGen {shared('scenario')}"),
        (
            "dataset",
            f"{shared('dataset')}: {', '.join(map(str, queries))} of its {total if total else 'unknown'} samples, "
            "each issued once (equal issue), the same samples in every run",
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
    ]


def plots(report: dict) -> dict[str, bytes]:
    """name -> PNG bytes."""
    figs = report["figures"]
    ablation, sweep = _ablation(figs), _sweep(figs)
    t = report["targets_ms"]
    out = {}

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for f in ablation:
        for ax, values in zip(axes, (f["ttfts_ms"], f["tpots_ms"])):
            ordered = sorted(values)
            ax.step(ordered, [(i + 1) / len(ordered) for i in range(len(ordered))], where="post", label=f["label"])
    for ax, name, target in zip(axes, ("TTFT", "TPOT"), (t["ttft"], t["tpot"])):
        ax.axvline(target, color="gray", linestyle="--", label=f"target {target:g} ms")
        _axis(ax, f"{name} (ms)", "share of queries", f"{name} per query (CDF)")
    axes[1].legend(fontsize=7)
    out["latency_cdf"] = _png(fig)

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, name, target in zip(
        axes, ("ttft_p99_ms", "tpot_p99_ms"), ("p99 TTFT", "p99 TPOT"), (t["ttft"], t["tpot"])
    ):
        for f in ablation:
            if f["tokens_per_s"] is not None and f[key] is not None:
                ax.scatter(f["tokens_per_s"], f[key], label=f["label"])
        if len(sweep) > 1:
            ax.plot([f["tokens_per_s"] for f in sweep], [f[key] for f in sweep], "k.-", label="load sweep")
        ax.axhline(target, color="gray", linestyle="--", label=f"target {target:g} ms")
        _axis(ax, "throughput (tokens/s)", f"{name} (ms)")
        ax.set_yscale("log")
    axes[1].legend(fontsize=7)
    out["throughput_latency"] = _png(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    points = sweep if len(sweep) > 1 else [f for f in figs if f["target_qps"] and f["completed_qps"] is not None]
    rates = [f["target_qps"] for f in points]
    ax.plot(rates, [f["completed_qps"] for f in points], "o-", label="completed (q/s)")
    ax.plot(rates, [f["goodput_qps"] or 0 for f in points], "s-", label="goodput (q/s)")
    ax.plot(rates, rates, color="gray", linestyle=":", label="arrival rate")
    _axis(ax, "arrival rate (q/s)", "queries per second", "Goodput against load")
    ax.legend(fontsize=7)
    out["goodput_rate"] = _png(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    scored = [f for f in ablation if "rouge1" in f["quality"] and f["tokens_per_s"] is not None]
    for f in scored:
        ax.scatter(f["tokens_per_s"], f["quality"]["rouge1"], label=f["label"])
    if scored:
        ax.axhline(
            report["quality_target"] * scored[0]["quality"]["rouge1"],
            color="gray",
            linestyle="--",
            label=f"{report['quality_target']:.0%} of {scored[0]['label']}",
        )
    _axis(ax, "throughput (tokens/s)", "rouge1", "Quality against speed")
    ax.legend(fontsize=7)
    out["quality_speed"] = _png(fig)
    return out


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
    md = [f"# {title}", ""]
    md += [f"- **{k}**: {v}" for k, v in conditions(report)]
    md += ["", "## How each figure is computed", "", report["method"], ""]
    md += [f"- note: {n}" for n in report["notes"]]
    for _, caption, header, rows in tables(report):
        md += ["", f"## {caption}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        md += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    md += ["", "## Plots", ""] + [f"![{name}]({name}.png)" for name in images]
    (out / "report.md").write_text("\n".join(md) + "\n")

    e = html.escape
    body = [f"<h1>{e(title)}</h1>", "<table class='conditions'>"]
    body += [f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in conditions(report)]
    body += ["</table>", "<h2>How each figure is computed</h2>", f"<pre>{e(report['method'])}</pre>"]
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
    ]
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
