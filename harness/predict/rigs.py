"""Capacity on a GPU rig before it has run: each step's cost from the GPU's data sheet (HBM
bandwidth, dense tensor peak) times stated efficiency factors, as a roofline (a step reads the
weights and the decoding rows' KV cache, and computes its tokens' GEMMs and attention: it costs the
longer of the two, plus a fixed host time per step); then the same simulation as on the CPU demo
(harness/predict/simulate.py: the engine's own scheduler at the rig's engine settings, LoadGen's
arrivals and p99s) for one GPU's replica at its share of the load.

    python -m harness.predict.rigs [--rigs ...] [--dtypes ...] [--json F] [--write-user-conf]
    python -m harness.predict.rigs --placement    # DistServe's: prefill and decode GPUs per rig

What it assumes, each said in measurements/rig-predictions.md: every request has the benchmark's
mean prompt and mean answer (not their distribution); one data-parallel replica takes 1/N of a
Poisson stream (LoadGen's arrivals split at random; the pool's least-outstanding routing does
better, so this is conservative); a simulated Server run of two minutes of arrivals judged by its
p99s alone (the official run is ten minutes under early stopping). The band is the efficiency
factors' stated spread. Step costs fitted on a GPU's measured engine steps (gpu-check's) would
replace the data sheet's; no GPU has run gpu-check, so that path is not built.
"""

import argparse
import dataclasses
import json
import math
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

from harness.predict.simulate import Engine, Layout, Workload, capacity, latencies_ns, run
from sut.config.engine import EngineConfig
from systems.benchmarks import BENCHMARKS, with_conf_value
from systems.schema import REPO, System

# A simulated Server run: two minutes of arrivals (at least SIM_QUERIES), long enough that a rate
# past what the replica serves shows in its queue (a few hundred queries did not: their p99 TTFT
# met the limit at 1.1x the Offline rate), short of the official ten minutes to keep it to seconds.
SIM_DURATION_MS = 120_000
SIM_QUERIES = 1000
SEED = 1  # LoadGen's arrivals; any seed is a fair draw for a prediction


@dataclass(frozen=True)
class Gpu:
    """A data sheet's figures (NVIDIA H100 and H200 Tensor Core GPU data sheets, SXM form factor)."""

    name: str
    hbm_bytes_per_s: float
    dense_flops: dict  # dtype -> dense tensor-core peak FLOP/s (the sheets' sparse figures halved)
    memory_bytes: float


GPUS = {
    "H100-SXM-80GB": Gpu("H100 SXM", 3.35e12, {"bfloat16": 989.5e12, "fp8": 1979e12}, 80e9),
    "H200-SXM-141GB": Gpu("H200 SXM", 4.8e12, {"bfloat16": 989.5e12, "fp8": 1979e12}, 141e9),
}


@dataclass(frozen=True)
class Efficiency:
    """What share of a data sheet's peak a serving step reaches, and the host's time per step."""

    bandwidth: float  # of HBM bandwidth, reading weights and KV cache
    compute: float  # of dense tensor peak, in the GEMMs and attention
    host_s: float  # per step: scheduling, input preparation, launch (our engine's Python)
    spread: float  # the factors' own uncertainty: the band
    sources: tuple = ()


# Bandwidth: BabelStream reaches 87-95% of the sheets' HBM figure on H100 SXM and 84-93% on H200
# (Azure/AI-benchmarking-guide, Azure_Results/ND_H{1,2}00_v5_results.md); LLM decode reads less well
# (gpt-fast: 69% of an A100's at batch 1, its README; vLLM and SGLang at most 50% at batch 1,
# hazyresearch.stanford.edu/blog/2025-05-27-no-bubbles): 80% at the batches serving runs. Compute:
# the largest dense matmuls reach 80% of BF16 and 71-73% of FP8 peak on H100/H200
# (stas00/ml-engineering, compute/accelerator/README.md), FlashAttention-3 75% (arXiv 2407.08608):
# 70%. The host's time per step is not sourced: our engine schedules in Python and launches without
# CUDA graphs by default; 2 ms is a guess that gpu-check's measured steps will replace.
EFFICIENCY = Efficiency(bandwidth=0.80, compute=0.70, host_s=2.0e-3, spread=0.20)


@dataclass(frozen=True)
class ModelShape:
    """A decoder's shape (its config.json): what a token and a step read and compute."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int

    @property
    def parameters(self) -> float:
        attention = self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        mlp = 3 * self.hidden * self.intermediate
        return self.layers * (attention + mlp) + 2 * self.vocab * self.hidden

    def kv_bytes_per_token(self, dtype_bytes: float) -> float:
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes

    def attention_flops_per_pair(self) -> float:
        return 4 * self.layers * self.heads * self.head_dim  # QK^T and PV, 2 FLOPs a multiply-add


MODELS = {
    "llama3.1-8b": ModelShape("Llama-3.1-8B-Instruct", 32, 4096, 32, 8, 128, 14336, 128256),
    "llama2-70b-99.9": ModelShape("Llama-2-70b-chat-hf", 80, 8192, 64, 8, 128, 28672, 32000),
}


@dataclass
class RooflineCosts:
    """A step-cost model from a data sheet (StepCostModel's interface to the simulation): a step
    costs max(bytes read / bandwidth, FLOPs / compute) + the host's time, for one tensor-parallel
    rank's share of the model (an all-reduce's time is not counted)."""

    weight_bytes: float
    kv_bytes_per_token: float
    flops_per_token: float
    flops_per_pair: float
    bandwidth: float
    compute: float
    host_s: float
    median_error: float
    acceptance: list = field(default_factory=list)
    transfer_s_per_block: float = 0.0

    def seconds(self, shape: dict, scale: float = 1.0) -> float:
        tokens = shape["prefill_token"] + shape["decode_token"] + shape.get("draft_token", 0.0)
        memory = (self.weight_bytes + shape.get("decode_context", 0.0) * self.kv_bytes_per_token) / self.bandwidth
        compute = (tokens * self.flops_per_token + shape["attention"] * self.flops_per_pair) / self.compute
        return scale * (max(memory, compute) + self.host_s)

    def describe(self) -> str:
        return (
            f"roofline: {self.weight_bytes / 1e9:.1f} GB of weights at {self.bandwidth / 1e12:.2f} TB/s "
            f"({self.weight_bytes / self.bandwidth * 1e3:.2f} ms a step), {self.flops_per_token / 1e9:.1f} GFLOP "
            f"a token at {self.compute / 1e12:.0f} TFLOP/s, KV {self.kv_bytes_per_token / 1e3:.0f} kB a token, "
            f"host {self.host_s * 1e3:.1f} ms a step; band +-{self.median_error:.0%}"
        )


def roofline_costs(gpu: Gpu, model: ModelShape, dtype: str, tp: int, eff: Efficiency = EFFICIENCY) -> RooflineCosts:
    """One tensor-parallel rank's step costs: `dtype` "bfloat16" (2-byte weights and KV) or "fp8"
    (1-byte weights, FP8 GEMMs, bf16 KV)."""
    weight_bytes = 1.0 if dtype == "fp8" else 2.0
    return RooflineCosts(
        weight_bytes=model.parameters * weight_bytes / tp,
        kv_bytes_per_token=model.kv_bytes_per_token(2.0) / tp,
        flops_per_token=2 * model.parameters / tp,
        flops_per_pair=model.attention_flops_per_pair() / tp,
        bandwidth=gpu.hbm_bytes_per_s * eff.bandwidth,
        compute=gpu.dense_flops[dtype] * eff.compute,
        host_s=eff.host_s,
        median_error=eff.spread,
    )


@dataclass(frozen=True)
class Traffic:
    """A benchmark's mean request (its published figures; the sources are in the table's notes)."""

    prompt_tokens: int
    answer_tokens: int

    def workload(self, answer_tokens: int | None = None) -> Workload:
        """Every request this one, its answer `answer_tokens` long where given."""
        return Workload([[0] * self.prompt_tokens], [answer_tokens or self.answer_tokens])


# llama3.1-8b's answers: 128.0 tokens a sample in published Offline runs (tokens/s over samples/s,
# mlcommons/inference_results_v5.1 closed/HPE/results/HPE_Cray_XD670_H200_SXM_141GBx8_TRT and
# closed/RedHat/results/XE8640_4xH100_vLLM, llama3.1-8b/Offline/performance/run_1): nearly every
# answer reaches max_tokens (mlcommons/inference issue 2256). Its prompts: no published mean found;
# CNN/DailyMail's articles average 781 words (See et al., 2017), about 1,000 Llama-3 tokens with the
# instruction: an estimate, not a measurement.
TRAFFIC = {
    "llama3.1-8b": Traffic(prompt_tokens=1000, answer_tokens=128),
}


def rig_replica(rig: str, benchmark: str, scenario: str, dtype: str, root: Path = REPO):
    """(step costs, one replica's engine, replicas, GPUs a replica) of rig `rig` for `benchmark` and
    `scenario`, its weights in `dtype`."""
    system = System.load(f"8x{rig}", root)
    tp = system.engine_settings(scenario, benchmark).get("tensor_parallel_size", 1)
    costs = roofline_costs(GPUS[rig], MODELS[benchmark], dtype, tp)
    return (costs, *replica_engine(system, benchmark, scenario, costs), tp)


def replica_engine(system: System, benchmark: str, scenario: str, costs: RooflineCosts) -> tuple[Engine, int]:
    """One data-parallel replica of `system`'s engine for `benchmark` and `scenario` (its settings,
    its KV pool from the GPU's memory), and how many replicas the system runs."""
    settings = system.engine_settings(scenario, benchmark)
    replicas = settings.get("data_parallel_size", 1)
    keep = {f.name for f in dataclasses.fields(EngineConfig)} - {"data_parallel_size", "tensor_parallel_size"}
    config = EngineConfig.from_kwargs(**{k: v for k, v in settings.items() if k in keep})
    memory = GPUS[system.name.split("x", 1)[1]].memory_bytes * config.gpu_memory_utilization - costs.weight_bytes
    blocks = int(memory / (costs.kv_bytes_per_token * config.block_size))
    return Engine(config, blocks, costs, BENCHMARKS[benchmark].max_tokens("performance")), replicas


def offline_rate(engine: Engine, traffic: Traffic, queries: int) -> float:
    """Samples per second of one replica given `queries` at once (Offline's schedule)."""
    workload = traffic.workload()
    done = run(Layout([engine]), [0.0] * queries, [0] * queries, workload)
    return queries / max(end for *_, end, _ in done)


def simulated_schedule() -> dict:
    """A simulated Server run's LoadGen settings: SIM_DURATION_MS of arrivals, judged by its p99s."""
    schedule = {"schedule_rng_seed": SEED, "sample_index_rng_seed": SEED, "min_duration_ms": SIM_DURATION_MS}
    return schedule | {"min_query_count": SIM_QUERIES, "percentiles_only": True, "sample_draws": 1}


def latency_capacity(engine: Engine, traffic: Traffic, limits_ms: tuple, start_qps: float) -> tuple:
    """(capacity, low, high) of one replica at `limits_ms`: the highest rate whose simulated run's
    p99s meet them, and the same with every step costing the band's more and less."""
    workload, schedule = traffic.workload(), simulated_schedule()
    found = []
    for scale in (1.0, 1 + engine.costs.median_error, 1 - engine.costs.median_error):
        layout = Layout([engine]).scaled(scale)
        qps, _ = capacity(layout, workload, schedule, limits_ms, start_qps, tolerance=0.03)
        found.append(qps)
    return tuple(found)


def p99s(engine: Engine, traffic: Traffic, qps: float) -> tuple[float, float]:
    """A simulated run's p99 TTFT and TPOT in ms at `qps` (what the table quotes at the capacity)."""
    from harness.predict.loadgen_schedule import server_schedule
    from harness.predict.verdict import percentile

    times, _ = server_schedule(qps, SEED, SIM_DURATION_MS, SIM_QUERIES)
    workload = traffic.workload()
    ttft, tpot = latencies_ns(run(Layout([engine]), [t / 1e9 for t in times], [0] * len(times), workload))
    return percentile(ttft) / 1e6, percentile(tpot) / 1e6


# NVLink 4 on H100 and H200 SXM: 900 GB/s a GPU, both directions together (the data sheets): a KV
# handoff from a prefill GPU to a decode GPU at half, at the bandwidth efficiency.
NVLINK_BYTES_PER_S = 450e9
NO_LIMIT_MS = 1e9  # a phase simulated alone is judged by its own limit only


@dataclass
class Placement:
    """DistServe's question for one rig: of its GPUs, how many prefill and how many decode, for the
    scenario's limits; each phase's capacity per GPU simulated alone (prefill at the TTFT limit,
    answers of one token; decode at the TPOT limit, prompts handed over at NVLink's rate), a split's
    capacity the lower of its two pools'."""

    gpus: int
    prefill_per_gpu: float | None
    decode_per_gpu: float | None
    colocated_per_gpu: float | None

    def splits(self) -> list[tuple[int, int, float]]:
        """(prefill GPUs, decode GPUs, QPS) for every split, best first."""
        if not self.prefill_per_gpu or not self.decode_per_gpu:
            return []
        found = [
            (p, self.gpus - p, min(p * self.prefill_per_gpu, (self.gpus - p) * self.decode_per_gpu))
            for p in range(1, self.gpus)
        ]
        return sorted(found, key=lambda split: -split[2])


def placement(rig: str, benchmark: str, scenario: str, dtype: str, root: Path = REPO) -> Placement:
    costs, engine, replicas, tp = rig_replica(rig, benchmark, scenario, dtype, root)
    traffic, schedule = TRAFFIC[benchmark], simulated_schedule()
    ttft, tpot = BENCHMARKS[benchmark].latency_limits_ms[scenario]
    start = offline_rate(engine, traffic, SIM_QUERIES)
    prefill, _ = capacity(Layout([engine]), traffic.workload(1), schedule, (ttft, NO_LIMIT_MS), start)
    # The decode pool alone: prompts ready at once (a prefill costing nothing), handed over per block.
    nothing = dataclasses.replace(costs, weight_bytes=0.0, host_s=0.0, compute=math.inf)
    instant = Engine(engine.config, engine.num_blocks, nothing, engine.max_tokens)
    block = costs.kv_bytes_per_token * engine.config.block_size / (NVLINK_BYTES_PER_S * EFFICIENCY.bandwidth)
    layout = Layout([instant], [engine], block)
    decode, _ = capacity(layout, traffic.workload(), schedule, (NO_LIMIT_MS, tpot), start)
    colocated, _ = capacity(Layout([engine]), traffic.workload(), schedule, (ttft, tpot), start)
    return Placement(replicas * tp, prefill, decode, colocated)


# MLPerf's published per-GPU output tokens/s for the same benchmark (../shared/docs/v61-models.md,
# table 1a: the system's tokens/s over its accelerators), to set the predictions beside.
PUBLISHED = {
    ("H100-SXM-80GB", "llama3.1-8b", "Offline"): (5777, "v5.1 RedHat, 1xH100, vLLM 0.10.0, FP8"),
    ("H100-SXM-80GB", "llama3.1-8b", "Server"): (5104, "v5.1 RedHat, 1xH100, vLLM, FP8"),
    ("H200-SXM-141GB", "llama3.1-8b", "Offline"): (8255, "v5.1 HPE XD670 8xH200, TensorRT-LLM, FP8"),
    ("H200-SXM-141GB", "llama3.1-8b", "Server"): (8114, "v5.1 HPE 8xH200, TensorRT-LLM, FP8"),
    ("H200-SXM-141GB", "llama3.1-8b", "Interactive"): (6765, "v5.1 QCT 8xH200, TensorRT-LLM, FP8"),
}


@dataclass
class RigPrediction:
    rig: str
    benchmark: str
    scenario: str
    dtype: str
    replicas: int
    per_replica: tuple  # samples/s (Offline) or (capacity, low, high) QPS of one replica
    p99_ms: tuple = ()  # a latency scenario's simulated p99 TTFT and TPOT at its capacity
    costs: str = ""

    @property
    def qps(self) -> float | None:
        one = self.per_replica[0]
        return None if one is None else one * self.replicas

    def tokens_per_gpu(self, traffic: Traffic) -> float | None:
        one = self.per_replica[0]
        return None if one is None else one * traffic.answer_tokens


def predict_rig(rig: str, benchmark: str, scenario: str, dtype: str, root: Path = REPO) -> RigPrediction:
    costs, engine, replicas, _ = rig_replica(rig, benchmark, scenario, dtype, root)
    traffic = TRAFFIC[benchmark]
    # Offline issues the dataset once, its queries shared by the replicas.
    offline = offline_rate(engine, traffic, -(-BENCHMARKS[benchmark].dataset_size // replicas))
    if scenario == "Offline":
        return RigPrediction(rig, benchmark, scenario, dtype, replicas, (offline,), costs=costs.describe())
    limits = BENCHMARKS[benchmark].latency_limits_ms[scenario]
    found = latency_capacity(engine, traffic, limits, 0.8 * offline)
    p99 = p99s(engine, traffic, found[0]) if found[0] else ()
    return RigPrediction(rig, benchmark, scenario, dtype, replicas, found, p99, costs.describe())


def row(p: RigPrediction) -> str:
    """The table's line for a prediction."""
    tokens = p.tokens_per_gpu(TRAFFIC[p.benchmark])
    published = PUBLISHED.get((p.rig, p.benchmark, p.scenario))
    one = p.per_replica[0]
    band = f" ({p.per_replica[1] or 0:.1f}-{p.per_replica[2] or 0:.1f})" if len(p.per_replica) == 3 else ""
    latency = f"{p.p99_ms[0]:.0f} / {p.p99_ms[1]:.1f}" if p.p99_ms else ""
    theirs = f"{published[0]:,} ({published[1]})" if published else "none"
    ratio = f"{tokens / published[0]:.2f}" if published and tokens else ""
    return (
        f"| {p.rig} | {p.benchmark} | {p.scenario} | {p.dtype} | {one or 0:.2f}{band} | {tokens or 0:.0f} | "
        f"{latency} | {theirs} | {ratio} |"
    )


HEADER = (
    "| rig | benchmark | scenario | weights | predicted per GPU: QPS (band) | output tokens/s per GPU | "
    "p99 TTFT / TPOT ms | published tokens/s per GPU | predicted / published |\n|---|---|---|---|---|---|---|---|---|"
)


def write_user_conf(p: RigPrediction, root: Path, commit: str) -> None:
    """measurements/<rig>/<benchmark>/<scenario>/user.conf with target_qps the prediction's (a
    latency scenario's band low end: a rate predicted to pass), its comment saying so."""
    one = p.per_replica[0]
    low = p.per_replica[1] if len(p.per_replica) == 3 and p.per_replica[1] else one
    path = root / "measurements" / f"8x{p.rig}" / p.benchmark / p.scenario / "user.conf"
    what = "the samples/s" if p.scenario == "Offline" else "the low end of the band of the capacity"
    said = (
        f"8x{p.rig}, {p.benchmark} {p.scenario}: target_qps PREDICTED, not measured (the engine has not run on this "
        f"rig): `python -m harness.predict.rigs --write-user-conf` at {commit}: {p.replicas} replicas x {what} "
        f"predicted for one, from the {GPUS[p.rig].name} data sheet and the efficiency factors and mean request "
        f"of measurements/rig-predictions.md; its step costs with {p.dtype} weights: {p.costs}. `make submission` "
        "searches Server's and Interactive's capacity from a prediction made on the rig."
    )
    said = "".join(f"# {line}\n" for line in textwrap.wrap(said, 98))
    body = "".join(line + "\n" for line in path.read_text().splitlines() if not line.startswith("#"))
    conf_scenario = "Offline" if p.scenario == "Offline" else "Server"
    loadgen_model = BENCHMARKS[p.benchmark].loadgen_name(p.scenario)
    path.write_text(said + with_conf_value(body, loadgen_model, conf_scenario, "target_qps", f"{low * p.replicas:.1f}"))


def placement_row(found: Placement) -> str:
    """The placement table's cells after the configuration's: per-GPU capacities, the best split."""
    splits = found.splits()
    colocated = (found.colocated_per_gpu or 0) * found.gpus
    each = f"{found.prefill_per_gpu or 0:.1f} / {found.decode_per_gpu or 0:.1f} / {found.colocated_per_gpu or 0:.1f}"
    if not splits:
        return f"{each} | none | |"
    (p, d, qps), others = splits[0], splits[1:4]
    versus = f" ({qps / colocated:.2f}x colocated {colocated:.1f})" if colocated else ""
    return f"{each} | {p}P + {d}D: {qps:.1f} QPS{versus} | " + ", ".join(f"{a}P+{b}D {q:.1f}" for a, b, q in others)


def print_placements(args) -> None:
    print("| rig | benchmark | scenario | weights | per GPU: prefill / decode / colocated QPS | best split | next |")
    print("|---|---|---|---|---|---|---|")
    for rig in args.rigs:
        system = System.load(f"8x{rig}", args.root)
        for benchmark in args.benchmarks:
            for scenario in (s for s in system.scenarios if s != "Offline"):
                for dtype in args.dtypes:
                    found = placement(rig, benchmark, scenario, dtype, args.root)
                    print(f"| {rig} | {benchmark} | {scenario} | {dtype} | {placement_row(found)} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rigs", nargs="*", default=list(GPUS))
    parser.add_argument("--benchmarks", nargs="*", default=list(TRAFFIC))
    parser.add_argument("--dtypes", nargs="*", default=["bfloat16", "fp8"])
    parser.add_argument("--json", type=Path, help="write every prediction here too")
    parser.add_argument(
        "--write-user-conf", action="store_true", help="set measurements/<rig>/ target_qps to the system dtype's"
    )
    parser.add_argument(
        "--placement", action="store_true", help="DistServe's: the best prefill/decode split of each rig's GPUs instead"
    )
    parser.add_argument("--root", type=Path, default=REPO)
    args = parser.parse_args()
    from harness.run import code_commit

    if args.placement:
        print_placements(args)
        return

    commit = code_commit()
    rows = []
    print(HEADER, flush=True)
    for rig in args.rigs:
        system = System.load(f"8x{rig}", args.root)
        for benchmark in args.benchmarks:
            for scenario in system.scenarios:
                for dtype in args.dtypes:
                    p = predict_rig(rig, benchmark, scenario, dtype, args.root)
                    print(row(p), flush=True)
                    rows.append({**dataclasses.asdict(p), "tokens_per_gpu": p.tokens_per_gpu(TRAFFIC[benchmark])})
                    if args.write_user_conf and p.qps and dtype == system.engine_settings(scenario, benchmark)["dtype"]:
                        write_user_conf(p, args.root, commit)
    if args.json:
        record = {"commit": commit, "efficiency": dataclasses.asdict(EFFICIENCY), "rows": rows}
        args.json.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
