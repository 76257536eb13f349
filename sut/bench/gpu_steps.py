"""The engine's steps on a GPU without a checkpoint: a model of Llama-3.1-8B's shape with random
bf16 weights (sut.model.loader.random_model), run by the engine's own ModelRunner (KV cache, Triton
kernels, CUDA graphs where asked): decode steps at several batch sizes over contexts of about 1k
tokens, and one mixed step of a prefill chunk beside decodes. For each: the GPU time (CUDA events
around the forward), the host time (the step input's preparation and the forward's launches, what
sits on the critical path when the host is slower than the GPU), tokens/s, and the bytes the step
must read (weights, plus the K/V of every context) per second of GPU time against the card's
bandwidth: gpt-fast's roofline. The GPU check (sut/bench/gpu_check.py) runs it on a GPU at the
shapes of `ENGINE_MODELS` (`bench_engine`, below), also gpt-oss-120b's and DeepSeek-R1's; the tests
run it on a tiny shape on CPU, where both times are wall-clock. `tensor_parallel_check` runs a
random model over two ranks against one process (the GPU check's `check_tensor_parallel`, where
there is more than one GPU; the tests, on gloo)."""

import multiprocessing as mp
import queue
import statistics
import time

import torch
import torch.distributed as dist

from sut.config import EngineConfig, ModelConfig
from sut.engine.block_manager import BlockManager
from sut.engine.processes import WorkerGroup
from sut.errors import WorkerError
from sut.model.loader import random_model
from sut.parallel import Shard, broadcast, free_port, init_group
from sut.sampling_params import SamplingParams
from sut.sequence import Sequence
from sut.worker.kv_cache import kv_bytes_per_block
from sut.worker.model_runner import ModelRunner
from sut.worker.tp_worker import serve

LLAMA_31_8B = dict(
    architectures=["LlamaForCausalLM"],
    vocab_size=128256,
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    rms_norm_eps=1e-5,
    rope_theta=500000.0,
    max_position_embeddings=131072,
    dtype="bfloat16",
    rope_scaling=dict(
        rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192
    ),
)

# gpt-oss-120b's shape (its config.json): MXFP4 experts, sinks, a 128-token window on even layers.
GPT_OSS_120B = dict(
    architectures=["GptOssForCausalLM"],
    vocab_size=201088,
    hidden_size=2880,
    intermediate_size=2880,
    num_hidden_layers=36,
    num_attention_heads=64,
    num_key_value_heads=8,
    head_dim=64,
    attention_bias=True,
    rms_norm_eps=1e-5,
    rope_theta=150000.0,
    max_position_embeddings=131072,
    dtype="bfloat16",
    sliding_window=128,
    num_local_experts=128,
    num_experts_per_tok=4,
    rope_scaling=dict(
        rope_type="yarn",
        factor=32.0,
        beta_fast=32.0,
        beta_slow=1.0,
        truncate=False,
        original_max_position_embeddings=4096,
    ),
    quantization_config={"quant_method": "mxfp4"},
)


# deepseek-ai/DeepSeek-R1's config.json (v61-models.md section 2a): 61 layers, the first 3 dense; MLA;
# 256 routed experts (top 8 of 4 groups of 8) and 1 shared, of intermediate 2048; FP8 128x128 blocks.
DEEPSEEK_R1 = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "vocab_size": 129280,
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 61,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "n_group": 8,
    "topk_group": 4,
    "first_k_dense_replace": 3,
    "routed_scaling_factor": 2.5,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "max_position_embeddings": 163840,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000,
    "rope_scaling": {
        "type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1,
        "mscale": 1.0, "mscale_all_dim": 1.0,
    },
    "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]},
    "torch_dtype": "bfloat16",
    "eos_token_id": 1,
}  # fmt: skip


class StepBench:
    """A random model on `device` with a KV pool for `max_tokens` tokens, and steps over made-up
    sequences (their K/V are whatever the pool holds: attention's cost does not depend on it)."""

    def __init__(
        self,
        raw_config: dict,
        device: torch.device,
        max_num_seqs: int,
        max_model_len: int,
        max_tokens: int,
        cuda_graphs: bool = False,
        block_size: int = 16,
        one_rank_of: int = 1,
        **settings,
    ):
        """`one_rank_of` N > 1: rank 0's share of a tensor- (and expert-) parallel model of N ranks, alone
        in a process group of one (its all-reduces move nothing; its logits are its vocabulary slice's):
        a rank's compute without the collectives' time, where the whole model fits no one device."""
        self.model_config = ModelConfig.from_dict(raw_config, "the benchmark's model")
        mc, dtype = self.model_config, self.model_config.dtype
        self.device = torch.device(device)
        num_blocks = -(-max_tokens // block_size) + max_num_seqs
        if any(mc.layer_window(i) for i in range(mc.num_layers)):  # window layers' own tables, at most as many
            num_blocks *= 2
        self.config = EngineConfig.from_kwargs(
            max_num_seqs=max_num_seqs,
            block_size=block_size,
            num_kv_blocks=num_blocks,
            max_model_len=max_model_len,
            cuda_graphs=cuda_graphs,
            **settings,
        )
        shard, self.group = None, False
        if one_rank_of > 1:
            shard, self.group = Shard(0, one_rank_of), True
            init_group(0, 1, free_port(), self.device)
        try:
            model = random_model(mc, dtype, self.device, shard=shard)
            self.runner = ModelRunner(
                None, mc, self.config, max_model_len, dtype, self.device, num_blocks, model=model, shard=shard
            )
        except BaseException:
            self.close()
            raise
        self.block_manager = BlockManager(num_blocks, block_size, sliding_window=self.runner.kv_window)
        named = [(n, p.numel() * p.element_size()) for n, p in model.named_parameters()]
        # A step reads embedding rows only, and of a mixture of experts the experts its tokens pick.
        self.expert_bytes = sum(b for n, b in named if ".experts." in n)
        self.weight_bytes = sum(
            b for n, b in named if ("embed_tokens" not in n or mc.tie_word_embeddings) and ".experts." not in n
        )
        self.kv_bytes_per_token = kv_bytes_per_block(mc, block_size, dtype) // block_size
        self._next = 0

    def close(self) -> None:
        """The process group of one, where `one_rank_of` made it."""
        if self.group:
            dist.destroy_process_group()
            self.group = False

    def _sequence(self, context: int) -> Sequence:
        self._next += 1
        tokens = [(self._next * 7919 + i) % self.model_config.vocab_size for i in range(context)]
        seq = Sequence(f"bench-{self._next}", tokens, SamplingParams(), 1)
        assert self.block_manager.allocate(seq, context), "the benchmark's KV pool is too small"
        return seq

    def measure(self, num_decodes: int, context: int, prefill: int = 0, repeats: int = 10) -> dict:
        """A step of `num_decodes` decodes at `context` tokens each (plus one prefill chunk of `prefill`
        tokens after as many cached): median GPU and host milliseconds over `repeats`."""
        seqs = [self._sequence(context) for _ in range(num_decodes)]
        tokens, starts, logits = [[s.token_ids[-1]] for s in seqs], [context - 1] * num_decodes, [1] * num_decodes
        if prefill:
            chunk = self._sequence(2 * prefill)
            seqs.append(chunk)
            tokens.append(list(chunk.token_ids[prefill:]))
            starts.append(prefill)
            logits.append(1)
        tables, window_tables = self.block_manager.block_tables, self.block_manager.window_tables
        cuda = self.device.type == "cuda"
        gpu, host = [], []
        try:
            for i in range(repeats + 2):  # the first two compile and warm
                if cuda:
                    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    begin.record()
                t0 = time.perf_counter()
                step = self.runner.prepare_tokens(seqs, tokens, starts, logits, tables, window_tables)
                self.runner.execute(step)
                t1 = time.perf_counter()
                if cuda:
                    end.record()
                    end.synchronize()
                if i >= 2:
                    host.append((t1 - t0) * 1e3)
                    gpu.append(begin.elapsed_time(end) if cuda else (t1 - t0) * 1e3)
        finally:
            for seq in seqs:
                self.block_manager.free(seq)
        gpu_ms = statistics.median(gpu)
        kv_bytes = num_decodes * self.kv_read(context) + (self.kv_read(2 * prefill) if prefill else 0)
        weight_bytes = self.weight_bytes + int(self.expert_bytes * self.experts_touched(num_decodes + prefill))
        return dict(
            decodes=num_decodes,
            context=context,
            prefill=prefill,
            gpu_ms=gpu_ms,
            host_ms=statistics.median(host),
            tokens_per_s=(num_decodes + prefill) / gpu_ms * 1e3,
            bytes_read=weight_bytes + kv_bytes,
            gbps=(weight_bytes + kv_bytes) / gpu_ms / 1e6,
            cuda_graphs=self.runner.graphs is not None,
        )

    def kv_read(self, context: int) -> int:
        """The K/V bytes one sequence's attention reads at `context` tokens: every layer's, or with
        window layers beside full ones, the full layers' whole context and the window layers' window."""
        window = self.runner.kv_window
        return self.kv_bytes_per_token * (context + (min(context, window) if window else 0))

    def experts_touched(self, num_tokens: int) -> float:
        """The expected share of the experts that `num_tokens` tokens routed uniformly at random pick
        (each its top-k of E): 1 - (1 - k/E)^tokens. 1 for a dense model (no expert bytes anyway)."""
        moe = self.model_config.moe
        if moe is None:
            return 1.0
        return 1 - (1 - moe.experts_per_token / moe.num_experts) ** num_tokens


def tensor_parallel_check(
    raw_config: dict, device_type: str, size: int = 2, steps: int = 6, seed: int = 0, **settings
) -> dict:
    """`size` ranks (processes on torch.distributed, one GPU each on CUDA) against one process on the
    same random model (random_model gives each rank its slices): a prefill of three prompts, then
    greedy decode steps, the ranks' logits against the one process's. Returns the largest logit
    difference, the logits' scale and whether every greedy token agreed."""
    port, results = free_port(), mp.get_context("spawn").Queue()
    ranks = WorkerGroup(
        _check_rank,
        [(r, size, port, raw_config, device_type, steps, seed, settings, results) for r in range(size)],
        [f"tensor-parallel check rank {r}" for r in range(size)],
    )
    try:
        while True:
            try:
                return results.get(timeout=1.0)
            except queue.Empty:
                if (dead := ranks.dead(failed_only=True)) is not None:
                    raise WorkerError(f"tensor-parallel check: {dead}") from None
    finally:
        ranks.stop(timeout_s=30)


def _check_rank(rank, size, port, raw_config, device_type, steps, seed, settings, results) -> None:
    device = torch.device(device_type, rank) if device_type == "cuda" else torch.device("cpu")
    if device_type == "cuda":
        torch.cuda.set_device(device)
    init_group(rank, size, port, device)
    try:
        mc = ModelConfig.from_dict(raw_config, "the check's model")
        config = EngineConfig.from_kwargs(block_size=16, num_kv_blocks=16, max_model_len=128, **settings)
        shard = Shard(rank, size)
        tp = ModelRunner(
            None,
            mc,
            config,
            128,
            mc.dtype,
            device,
            16,
            model=random_model(mc, mc.dtype, device, seed, shard),
            shard=shard,
        )
        if rank:
            serve(tp, device)
            return
        whole = ModelRunner(None, mc, config, 128, mc.dtype, device, 16, model=random_model(mc, mc.dtype, device, seed))
        results.put(_compare(whole, tp, mc.vocab_size, steps))
        broadcast(None)
    finally:
        dist.destroy_process_group()


def _compare(whole: ModelRunner, tp: ModelRunner, vocab: int, steps: int) -> dict:
    """Three prompts through both runners (each its own KV cache, the same block tables), one
    prefill and `steps` decodes, each fed the one process's greedy tokens."""
    generator = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, vocab, (n,), generator=generator).tolist() for n in (5, 17, 9)]
    blocks = BlockManager(16, 16)
    seqs = [Sequence(f"check-{i}", p + [0] * steps, SamplingParams(), steps) for i, p in enumerate(prompts)]
    for seq in seqs:
        assert blocks.allocate(seq, seq.num_tokens)
    tokens, starts = prompts, [0] * len(seqs)
    worst, scale, agree = 0.0, 0.0, True
    for _ in range(steps + 1):
        want = whole.execute(whole.prepare_tokens(seqs, tokens, starts, [1] * len(seqs), blocks.block_tables))
        got = tp.execute(tp.prepare_tokens(seqs, tokens, starts, [1] * len(seqs), blocks.block_tables))
        worst = max(worst, float((got - want).abs().max()))
        scale = max(scale, float(want.abs().max()))
        agree &= bool(torch.equal(got.argmax(-1), want.argmax(-1)))
        starts = [s + len(t) for s, t in zip(starts, tokens)]
        tokens = [[t] for t in want.argmax(-1).tolist()]
    return dict(size=tp.shard.size, steps=steps, max_abs_logit_diff=worst, logit_scale=scale, greedy_tokens_agree=agree)


# The GPU check's engine steps (sut/bench/gpu_check.py), decodes over ~1k-token contexts and one
# mixed step of a prefill chunk beside decodes, per model: (its shape, what it is, decode batches,
# (decodes, chunk) mixed). DeepSeek-R1: rank 0's share of TP/EP 8 (the whole model fits no one GPU),
# eager (the engine refuses CUDA graphs with tensor parallelism).
ENGINE_CONTEXT = 1024
ENGINE_MODELS = {
    "llama3.1-8b": (LLAMA_31_8B, "random bf16 weights", [1, 32, 128, 256], (256, 2048), {}),
    "gpt-oss-120b": (GPT_OSS_120B, "random MXFP4 experts, about 61 GB", [1, 64, 256], (64, 2048), {}),
    "deepseek-r1": (
        DEEPSEEK_R1,
        "random FP8 block-scaled weights, one rank's share of TP/EP 8 (about 85 GB), its collectives not timed",
        [1, 16, 64],
        (64, 2048),
        dict(one_rank_of=8, cuda_graphs=False),
    ),
}


def bench_engine(device, peak_gbps, model: str) -> list[dict]:
    """Each step eager and from CUDA graphs where the model takes them (the mixed step runs eagerly
    either way)."""
    raw, what, batches, (decodes, prefill), options = ENGINE_MODELS[model]
    options = dict(cuda_graphs=True) | options
    print(f"  engine steps: a {model}-shaped model with {what}", flush=True)
    bench = StepBench(
        raw,
        device,
        max_num_seqs=max(batches),
        max_model_len=2 * prefill,
        max_tokens=max(batches) * ENGINE_CONTEXT + 2 * prefill,
        **options,
    )
    graphs = bench.runner.graphs
    rows = []
    try:
        for mode in ("eager", "CUDA graphs") if graphs else ("eager",):
            bench.runner.graphs = graphs if mode == "CUDA graphs" else None
            for batch in batches:
                print(f"  {model} decode step, batch {batch}, {mode}", flush=True)
                rows.append(bench.measure(batch, ENGINE_CONTEXT))
            if mode == "eager":
                print(f"  {model} mixed step: {prefill} prefill tokens + {decodes} decodes", flush=True)
                rows.append(bench.measure(decodes, ENGINE_CONTEXT, prefill=prefill))
    finally:
        bench.close()
    for row in rows:
        row["model"] = model
        row["weight_bytes"] = bench.weight_bytes + bench.expert_bytes
        row["peak_ratio"] = row["gbps"] / peak_gbps if peak_gbps else None
        row["host_share"] = row["host_ms"] / row["gpu_ms"]
    del bench, graphs
    torch.cuda.empty_cache()
    return rows


def check_tensor_parallel() -> dict:
    """TP=2 against one process on two of the GPUs (`tensor_parallel_check`: a two-layer model of
    Llama-3.1-8B's width, fp32, random weights), where there is more than one GPU."""
    count = torch.cuda.device_count()
    if count < 2:
        print(f"  tensor parallel: {count} GPU here, so no TP=2 check", flush=True)
        return dict(skipped=f"{count} GPU")
    try:
        result = tensor_parallel_check({**LLAMA_31_8B, "num_hidden_layers": 2, "dtype": "float32"}, "cuda")
    except Exception as e:  # noqa: BLE001 - reported in the results
        return dict(ok=False, error=f"{type(e).__name__}: {e}")
    result["ok"] = result["greedy_tokens_agree"] and result["max_abs_logit_diff"] <= 1e-3 * max(
        1.0, result["logit_scale"]
    )
    print(
        f"  tensor parallel: TP=2 {'matches' if result['ok'] else 'DIFFERS from'} one process (largest logit "
        f"difference {result['max_abs_logit_diff']:.2e} of {result['logit_scale']:.2f})",
        flush=True,
    )
    return result
