"""The KV-cache pool's layout and size: what it holds per token and layer, which layers share an
index (sliding-window layers beside full ones), the bytes of one block, the blocks one sequence
needs, and how many blocks the memory left for the pool holds. The runner
(sut/worker/model_runner.py) allocates the pool from these; the rig checks and benchmarks size
their caches with them."""

import torch

from sut.config import EngineConfig, ModelConfig
from sut.errors import ConfigError


def kv_window(c: ModelConfig) -> int | None:
    """The window of the model's sliding-window layers where it also has full-attention ones (two
    block tables per sequence), else None (one table: every layer keeps every token)."""
    windows = {c.layer_window(i) for i in range(c.num_layers)}
    return max(w for w in windows if w is not None) if None in windows and len(windows) > 1 else None


def kv_layer_slots(c: ModelConfig) -> list[int]:
    """Each layer's index in the KV cache's layer dimension: with two tables, a full layer and a
    window layer share an index (their blocks come from different tables, so never the same block)."""
    if kv_window(c) is None:
        return list(range(c.num_layers))
    seen = {True: 0, False: 0}
    slots = []
    for i in range(c.num_layers):
        full = c.layer_window(i) is None
        slots.append(seen[full])
        seen[full] += 1
    return slots


def kv_entry(c: ModelConfig) -> tuple[int, int, int]:
    """What the KV cache holds per token per layer: (tensors, heads, dims): a key and a value of
    each KV head, or with latent attention one entry (the latent and the rope key)."""
    if c.mla is not None:
        return 1, 1, c.mla.cache_dim
    return 2, c.num_kv_heads, c.head_dim


def kv_bytes_per_block(c: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    layers = max(kv_layer_slots(c)) + 1
    tensors, heads, dim = kv_entry(c)
    return tensors * layers * block_size * heads * dim * dtype.itemsize


def blocks_for_one_sequence(c: ModelConfig, block_size: int, length: int, chunk: int) -> int:
    """The blocks one sequence of `length` tokens holds at most: with window layers, its full table
    and, for the window's tokens and a chunk's beyond them, its window table."""
    blocks = -(-length // block_size)
    window = kv_window(c)
    if window is None:
        return blocks
    return blocks + min(blocks, -(-(window + chunk) // block_size) + 1)


def blocks_from_memory(
    config: EngineConfig,
    c: ModelConfig,
    dtype: torch.dtype,
    device: torch.device,
    default_bytes: int | None,
    draft: tuple[ModelConfig, int] | None = None,
) -> int:
    """The blocks of model `c`'s cache in `dtype` that fit the memory left for the pool:
    `kv_cache_memory_gb`, else on CUDA what is free beyond `gpu_memory_utilization`'s reserve and
    one step's activations and logits, else `default_bytes` (the CPU backend's). `draft`: a draft
    model's config and weight bytes, loaded after the target: its weights (on CUDA) and its cache of
    as many blocks come out of the same memory."""
    if config.kv_cache_memory_gb is not None:
        budget = config.kv_cache_memory_gb * 2**30
    elif device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        # Leave room for one step's activations and logits (a generous estimate).
        activations = config.max_num_batched_tokens * (6 * c.hidden_size + 3 * c.intermediate_size) * 4
        logits = config.max_num_seqs * c.vocab_size * 4 * 3
        budget = free - (1 - config.gpu_memory_utilization) * total - activations - logits
    else:
        budget = default_bytes
    per_block = kv_bytes_per_block(c, config.block_size, dtype)
    if draft is not None:
        draft_config, draft_weight_bytes = draft
        budget -= draft_weight_bytes if device.type == "cuda" else 0
        per_block += kv_bytes_per_block(draft_config, config.block_size, dtype)
    return max(0, int(budget // per_block))


def check_holds_one_sequence(
    c: ModelConfig, num_blocks: int, block_size: int, max_model_len: int, max_num_batched_tokens: int
) -> None:
    """ConfigError unless a pool of `num_blocks` holds one sequence of max_model_len tokens."""
    needed = blocks_for_one_sequence(c, block_size, max_model_len, max_num_batched_tokens)
    if num_blocks < needed:
        raise ConfigError(
            f"KV cache of {num_blocks} blocks x {block_size} tokens cannot hold one sequence of "
            f"max_model_len={max_model_len} tokens ({needed} blocks); raise num_kv_blocks / kv_cache_memory_gb "
            "or lower max_model_len"
        )
