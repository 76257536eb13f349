"""The GPU check's results: results.json as the checks and benchmarks left them, and results.md, a
page of tables (correctness; the kernels' benchmarks against the measured peaks; the engine's steps
where they ran) and issue 15's goals against those (sut/bench/gpu_check.py)."""

import json
import time
from pathlib import Path

from kernels.checks.shapes import (
    GPT_OSS_HEADS,
    GPT_OSS_WINDOW,
    MLA_ABSORBED_DIMS,
    MLA_ABSORBED_HEADS,
    MLA_DECOMPRESSED,
    MOE_SHAPE,
)


def _pct(x):
    return "-" if x is None else f"{100 * x:.0f}%"


def _num(x, fmt: str, suffix: str = "") -> str:
    return "-" if x is None else f"{x:{fmt}}{suffix}"


def targets(results: dict) -> list[str]:
    """Issue 15's goals, against the measured peaks: decode attention >= 85% of the copy bandwidth
    at batch >= 32 and context >= 2048; prefill attention >= 60% of the bf16 GEMM rate; an 8B decode
    step at batch 1 >= 85% of the weight-read roofline (gpt-fast's bar); host time under 10% of the
    step at batch 256."""
    lines = []

    def goal(what, rows, key, bar, best=min):
        rows = [r for r in rows if r is not None and r.get(key) is not None]
        if rows:
            met = sum(r[key] >= bar if key != "host_share" else r[key] < bar for r in rows)
            lines.append(
                f"{what}: met in {met} of {len(rows)} ({'lowest' if best is min else 'best'} "
                f"{_pct(best(r[key] for r in rows))})."
            )

    goal(
        "Decode attention >= 85% of the measured bandwidth at batch >= 32, context >= 2048",
        [r for r in results["decode"] if r["batch"] >= 32 and r["context"] >= 2048],
        "peak_ratio",
        0.85,
    )
    goal("Prefill attention >= 60% of the measured bf16 GEMM rate", results["prefill"], "peak_ratio", 0.6, max)
    engine = [r for r in results.get("engine", []) if not r["prefill"] and r["model"] == "llama3.1-8b"]
    goal(
        "8B decode step at batch 1 >= 85% of the weight-plus-KV roofline (best of eager and graphs)",
        [max((r for r in engine if r["decodes"] == 1), key=lambda r: r["peak_ratio"] or 0, default=None)]
        if engine
        else [],
        "peak_ratio",
        0.85,
    )
    goal(
        "Host time under 10% of the step at batch 256 (best of eager and graphs)",
        [min((r for r in engine if r["decodes"] == 256), key=lambda r: r["host_share"], default=None)]
        if engine
        else [],
        "host_share",
        0.10,
    )
    return [line for line in lines if line]


def markdown(results: dict) -> str:
    lines = [
        f"# gpu-check on {results['device']}",
        "",
        f"{results['software']}.",
        "",
        f"Measured: copy {_num(results['measured_gbps'], '.0f')} GB/s, dense bf16 GEMM "
        f"{_num(results['measured_tflops'], '.0f')} TFLOP/s (the ratios below are of these); data sheet "
        f"{results['peak_gbps'] or '?'} GB/s, {results['peak_tflops'] or '?'} TFLOP/s "
        f"(sut/bench/peaks.py PEAKS); {results['elapsed_s']:.0f} s in all.",
        "",
        "## Correctness (kernel vs PyTorch reference)",
        "",
        "| kernel | cases | failed | max abs error |",
        "|---|---|---|---|",
    ]
    for name, rows in results["checks"].items():
        failed = [r for r in rows if not r["ok"]]
        errors = [r["max_abs_err"] for r in rows if r["max_abs_err"] is not None]
        lines.append(f"| {name} | {len(rows)} | {len(failed)} | {_num(max(errors, default=None), '.2e')} |")
    for name, rows in results["checks"].items():
        for r in rows:
            if not r["ok"]:
                lines.append(f"\nFAILED {name}: {r['case']} {r['dtype']}: {r['error']}")
    tp = results.get("tensor_parallel")
    lines += (
        []
        if tp is None
        else [
            "",
            "Tensor parallel (TP=2 against one process, random two-layer model of the 8B width, fp32): "
            + (
                f"not run: {tp['skipped']}"
                if "skipped" in tp
                else f"FAILED: {tp['error']}"
                if "error" in tp
                else f"{'PASS' if tp['ok'] else 'FAIL'}, largest logit difference {tp['max_abs_logit_diff']:.2e} of "
                f"{tp['logit_scale']:.2f}, greedy tokens {'agree' if tp['greedy_tokens_agree'] else 'differ'}"
            ),
        ]
    )
    lines += [
        "",
        "## Decode attention (bf16, 32 q heads / 8 KV heads, head_dim 128, block size 16)",
        "",
        "| batch | context | ms | K/V GB/s | of peak | SDPA ms | speedup vs SDPA |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results["decode"]:
        lines.append(
            f"| {r['batch']} | {r['context']} | {r['ms']:.3f} | {r['gbps']:.0f} | {_pct(r['peak_ratio'])} | "
            f"{_num(r['sdpa_ms'], '.3f')} | {_num(r['speedup_vs_sdpa'], '.2f', 'x')} |"
        )
    lines += [
        "",
        "## Prefill attention (bf16, causal, same heads)",
        "",
        "| case | tokens | ms | TFLOP/s | of dense bf16 peak | SDPA ms | speedup vs SDPA |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results["prefill"]:
        lines.append(
            f"| {r['case']} | {r['tokens']} | {r['ms']:.3f} | {r['tflops']:.0f} | {_pct(r['peak_ratio'])} | "
            f"{_num(r['sdpa_ms'], '.3f')} | {_num(r['speedup_vs_sdpa'], '.2f', 'x')} |"
        )
    lines += (
        []
        if not results.get("gpt_oss_attention")
        else [
            "",
            f"## gpt-oss attention (bf16, {GPT_OSS_HEADS[0]} q heads / {GPT_OSS_HEADS[1]} KV heads, head_dim "
            f"{GPT_OSS_HEADS[2]}, block size 16, sinks; whole context or a {GPT_OSS_WINDOW}-key window)",
            "",
            "Rate: decode's GB/s of the K/V it must read (the window's alone), prefill's TFLOP/s over the visible "
            "keys. Plain: the same kernel with neither sinks nor window.",
            "",
            "| kernel | case | window | ms | plain ms | rate | of measured peak |",
            "|---|---|---|---|---|---|---|",
        ]
    )
    for r in results.get("gpt_oss_attention", []):
        lines.append(
            f"| {r['kernel']} | {r['case']} | {r['window'] or 'none'} | {r['ms']:.3f} | {r['plain_ms']:.3f} | "
            f"{r['rate']:.0f} {r['unit']} | {_pct(r['peak_ratio'])} |"
        )
    lines += (
        []
        if not results.get("mla_attention")
        else [
            "",
            f"## DeepSeek MLA attention (bf16, block size 16; absorbed: {' and '.join(map(str, MLA_ABSORBED_HEADS))} "
            f"q heads on one KV head of {MLA_ABSORBED_DIMS[0]} dims, V its first {MLA_ABSORBED_DIMS[1]}; decompressed: "
            f"{MLA_DECOMPRESSED[0]} heads, {MLA_DECOMPRESSED[1]}/{MLA_DECOMPRESSED[2]})",
            "",
            "GB/s: the cache the decode must read (each token's entry once). TFLOP/s: QK and PV over the visible "
            "keys. SDPA: torch's on the same K/V laid out contiguously.",
            "",
            "| kernel | heads | case | ms | GB/s | of measured bandwidth | TFLOP/s | of GEMM rate | SDPA ms "
            "| speedup vs SDPA |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
    )
    for r in results.get("mla_attention", []):
        lines.append(
            f"| {r['kernel']} | {r['heads']} | {r['case']} | {r['ms']:.3f} | {_num(r['gbps'], '.0f')} | "
            f"{_pct(r['peak_ratio'])} | {r['tflops']:.0f} | {_pct(r['tflops_ratio'])} | {_num(r['sdpa_ms'], '.3f')} | "
            f"{_num(r['speedup_vs_sdpa'], '.2f', 'x')} |"
        )
    lines += (
        []
        if not results.get("moe")
        else [
            "",
            f"## gpt-oss MoE (hidden {MOE_SHAPE[0]}, intermediate {MOE_SHAPE[1]}, {MOE_SHAPE[2]} experts, top-"
            f"{MOE_SHAPE[3]}; bf16 activations; kernels/fused_moe.py)",
            "",
            "GB/s: the weights of the experts the batch hits, each read once. torch: the reference, a loop over them.",
            "",
            "| weights | tokens | experts hit | ms | GB/s | of measured bandwidth | TFLOP/s | of GEMM rate "
            "| torch ms | speedup vs torch |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
    )
    for r in results.get("moe", []):
        lines.append(
            f"| {r['weights']} | {r['tokens']} | {r['experts_hit']} | {r['ms']:.3f} | {r['gbps']:.0f} | "
            f"{_pct(r['peak_ratio'])} | {r['tflops']:.0f} | {_pct(r['tflops_ratio'])} | {_num(r['torch_ms'], '.3f')} | "
            f"{_num(r['speedup_vs_torch'], '.2f', 'x')} |"
        )
    lines += (
        []
        if not results.get("fp8")
        else [
            "",
            "## FP8 weights (kernels/fp8.py: bf16 activations, e4m3 weights per channel or per 128x128 block)",
            "",
            "GB/s: the FP8 weights and scales read (of the experts, those the batch hits). Baseline: bf16 weights "
            "(torch's matmul; the dense Triton MoE).",
            "",
            "| kernel | scales | tokens | ms | GB/s | of measured bandwidth | TFLOP/s | bf16 ms | speedup vs bf16 |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
    )
    for r in results.get("fp8", []):
        lines.append(
            f"| {r['kernel']} | {r['scales']} | {r['tokens']} | {r['ms']:.3f} | {r['gbps']:.0f} | "
            f"{_pct(r['gbps'] / results['measured_gbps'])} | {r['tflops']:.1f} | {_num(r['bf16_ms'], '.3f')} | "
            f"{_num(r['speedup_vs_bf16'], '.2f', 'x')} |"
        )
    lines += (
        []
        if "engine" not in results
        else [
            "",
            "## Engine steps (random weights, block size 16; sut/bench/gpu_steps.py)",
            "",
            "Llama-3.1-8B's shape in bf16, gpt-oss-120b's with MXFP4 experts, and rank 0's share of DeepSeek-R1 "
            "at TP/EP 8 with FP8 weights (alone: its collectives not timed, its logits its vocabulary slice's). "
            "Roofline: the weights (the "
            "embedding's rows aside; of the experts, the expected share the step's tokens pick) plus the K/V "
            "each context reads (a window layer's window) once a step.",
            "",
            "| model | step | mode | GPU ms | host ms | host / GPU | tokens/s | GB/s read | of measured bandwidth |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
    )
    for r in results.get("engine", []):
        step = f"{r['decodes']} decodes x {r['context']}" + (f" + {r['prefill']} prefill" if r["prefill"] else "")
        lines.append(
            f"| {r['model']} | {step} | {'CUDA graphs' if r['cuda_graphs'] else 'eager'} | "
            f"{r['gpu_ms']:.3f} | "
            f"{r['host_ms']:.3f} | {_pct(r['host_share'])} | {r['tokens_per_s']:.0f} | {r['gbps']:.0f} | "
            f"{_pct(r['peak_ratio'])} |"
        )
    return "\n".join(lines + [""] + targets(results)) + "\n"


def write_results(results: dict, out: Path, start: float) -> int:
    """results.json and results.md under `out`; prints the page and the verdict; the exit status."""
    results["elapsed_s"] = time.time() - start
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    (out / "results.md").write_text(markdown(results))
    print(markdown(results))
    failed = (
        sum(not r["ok"] for rows in results["checks"].values() for r in rows)
        + len(results.get("engine_error", []))
        + (results.get("tensor_parallel", {}).get("ok") is False)
    )
    print(
        f"gpu-check: {'FAIL' if failed else 'PASS'}: {failed} failed case(s); results in {out}/results.md "
        f"({results['elapsed_s']:.0f} s)"
    )
    return 1 if failed else 0
