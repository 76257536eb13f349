"""The mixture-of-experts MLP after the router: each token's top-k experts, each a gated MLP,
weighted by the router's weights and summed. gpt-oss's experts have biases and a clamped SwiGLU
over interleaved gate/up columns; DeepSeek's (`activation="silu"`) have no biases and
`silu(gate) * up` over the gate half and the up half. A PyTorch reference (the CPU engine runs it)
and a Triton grouped GEMM (vLLM's fused_moe idea), for dense expert weights, for gpt-oss's MXFP4
ones and for DeepSeek's block-scaled FP8 ones, both decoded inside the kernel.

Per (token t, slot j) with expert e = topk_ids[t, j], as transformers' GptOssExperts computes it:

    gate_up = x[t] @ w_gate_up[e] + b_gate_up[e]          # [2I]: gate and up INTERLEAVED
    gate, up = gate_up[::2].clamp(max=limit), gate_up[1::2].clamp(-limit, limit)
    act = gate * sigmoid(gate * alpha) * (up + 1)          # [I]
    out[t] += topk_weights[t, j] * (act @ w_down[e] + b_down[e])

With `activation="silu"` (DeepSeek-V3/R1, as transformers' DeepseekV3 experts compute it):

    gate, up = (x[t] @ w_gate_up[e]).chunk(2)              # [2I]: gate HALF, then up half
    out[t] += topk_weights[t, j] * ((silu(gate) * up) @ w_down[e])

Layouts. Dense (transformers' parameters): `w_gate_up [E, H, 2I]` (gpt-oss: gate in the even
columns, up in the odd ones; silu: gate in the first I, up in the last I), `b_gate_up [E, 2I]`,
`w_down [E, I, H]`, `b_down [E, H]` (biases may be None); any strides, so a
transposed view of `[E, 2I, H]` weights (K-contiguous, the checkpoint's orientation, and the
better one for the kernel's loads) works as well. MXFP4 (the checkpoint, see kernels/mxfp4.py):
`gate_up_blocks [E, 2I, H/32, 16]`, `gate_up_scales [E, 2I, H/32]`, `down_blocks [E, H, I/32, 16]`,
`down_scales [E, H, I/32]`, i.e. `[out, in]`, transposed relative to the dense layout; contiguous.
FP8 (DeepSeek's checkpoint, see kernels/fp8.py): `w_gate_up` float8_e4m3fn `[E, 2I, H]` with
`scale_inv [E, ceil(2I/128), ceil(H/128)]` fp32, `w_down [E, H, I]` with `[E, ceil(H/128),
ceil(I/128)]`: nn.Linear's `[out, in]` per expert, one scale per 128 x 128 block; silu, no biases.
`topk_weights [T, k]` (fp32 from the router), `topk_ids [T, k]` (any int dtype) in [-1, E): a slot
whose id is -1 belongs to no expert here (expert parallelism: another rank's expert, vLLM's
`expert_map` convention) and contributes 0 to its token's output, whatever its weight.

The Triton path (no host syncs, so it can be captured in a CUDA graph):

1. `moe_align_block_size` sorts the T*k slots by expert and pads each expert's run to a multiple
   of BLOCK_M with the sentinel T*k, one expert id per M-block; the -1 slots form one more run
   after the experts', padded the same, whose M-blocks have expert id -1 (torch ops, sized by a
   static upper bound on the padded length; programs past the real length return at once).
2. `_fused_moe_kernel`, launch 1: per (M-block, N-block), rows of x gathered through
   `slot // k`, the expert's weights through `expert_ids[block]`; gate and up as two accumulators
   (columns 2n and 2n+1 for gpt-oss, n and I+n for silu), the bias and the activation fused;
   writes `act [T*k, I]` by slot. An M-block of expert -1 writes zeros to its slots' rows and
   reads no weights.
3. Launch 2: `act @ w_down[e] + b_down[e]`, times the slot's routing weight, to `[T*k, H]` fp32 by
   slot (each slot written by exactly one program: no atomics; zeros for the -1 slots), then a sum
   over k.

In the MXFP4 variant the K loop decodes a `[BLOCK_K, BLOCK_N]` weight tile from packed bytes and
scales (`kernels.mxfp4.mxfp4_weight_tiles`) as two half tiles, the even k and the odd k, and
multiplies them with the even and odd columns of the activation tile; the decoded values are exact
in bf16, so the dot runs on bf16 tensor cores with the dense path's numerics. In the FP8 variant
the K loop converts each FP8 tile to the activations' dtype (exact) and multiplies each K step's
fp32 product by its 128 x 128 block's scale (per output column; BLOCK_K divides 128).
"""

from collections.abc import Callable

import torch
import triton
import triton.language as tl

from kernels.fp8 import FP8_BLOCK, FP8_DTYPE, dequantize_fp8
from kernels.mxfp4 import MXFP4_BLOCK, dequantize_mxfp4, mxfp4_weight_tiles
from kernels.triton_utils import check_dot_dim, upcast_dot_operands

SWIGLU_ALPHA = 1.702
SWIGLU_LIMIT = 7.0
# The experts' activations: gpt-oss's clamped SwiGLU over interleaved gate/up columns, and
# silu(gate) * up over the gate half and the up half (DeepSeek); the kernel's codes for them.
ACTIVATIONS = {"gpt_oss": 1, "silu": 2}


def _activation_code(activation: str) -> int:
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {list(ACTIVATIONS)}, got {activation!r}")
    return ACTIVATIONS[activation]


def _check_routing(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> None:
    if x.dim() != 2:
        raise ValueError(f"x must be [tokens, hidden], got {list(x.shape)}")
    if topk_ids.dim() != 2 or topk_ids.shape[0] != x.shape[0] or topk_weights.shape != topk_ids.shape:
        raise ValueError(
            f"topk_ids and topk_weights must both be [tokens={x.shape[0]}, k], got {list(topk_ids.shape)} and "
            f"{list(topk_weights.shape)}"
        )
    if topk_ids.is_floating_point() or topk_ids.dtype == torch.bool:
        raise TypeError(f"topk_ids must be integers, got {topk_ids.dtype}")


def _check_dense(x, w_gate_up, b_gate_up, w_down, b_down) -> tuple[int, int, int]:
    """(E, H, I) of dense expert weights, with every shape checked."""
    if w_gate_up.dim() != 3 or w_gate_up.shape[2] % 2:
        raise ValueError(f"w_gate_up must be [experts, hidden, 2 * intermediate], got {list(w_gate_up.shape)}")
    num_experts, hidden, two_i = w_gate_up.shape
    expected = {
        "x": (x.shape, (x.shape[0], hidden)),
        "b_gate_up": (None if b_gate_up is None else b_gate_up.shape, (num_experts, two_i)),
        "w_down": (w_down.shape, (num_experts, two_i // 2, hidden)),
        "b_down": (None if b_down is None else b_down.shape, (num_experts, hidden)),
    }
    for name, (got, want) in expected.items():
        if got is not None and tuple(got) != want:
            raise ValueError(f"{name} must be {list(want)} for w_gate_up {list(w_gate_up.shape)}, got {list(got)}")
    return num_experts, hidden, two_i // 2


def _check_mxfp4_experts(x, gate_up_blocks, gate_up_scales, b_gate_up, down_blocks, down_scales, b_down):
    """(E, H, I) of MXFP4 expert weights, with every shape and dtype checked."""
    for name, t in (("gate_up_blocks", gate_up_blocks), ("down_blocks", down_blocks)):
        if t.dtype != torch.uint8 or t.dim() != 4 or t.shape[3] != MXFP4_BLOCK // 2:
            raise ValueError(f"{name} must be uint8 [experts, out, in/32, 16], got {t.dtype} {list(t.shape)}")
    num_experts, two_i, hidden_blocks, _ = gate_up_blocks.shape
    hidden, intermediate = hidden_blocks * MXFP4_BLOCK, two_i // 2
    expected = {
        "x": (x.shape, (x.shape[0], hidden)),
        "gate_up_scales": (gate_up_scales.shape, (num_experts, two_i, hidden_blocks)),
        "b_gate_up": (b_gate_up.shape, (num_experts, two_i)),
        "down_blocks": (down_blocks.shape, (num_experts, hidden, intermediate // MXFP4_BLOCK, 16)),
        "down_scales": (down_scales.shape, (num_experts, hidden, intermediate // MXFP4_BLOCK)),
        "b_down": (b_down.shape, (num_experts, hidden)),
    }
    for name, (got, want) in expected.items():
        if tuple(got) != want:
            raise ValueError(
                f"{name} must be {list(want)} for gate_up_blocks {list(gate_up_blocks.shape)}, got {list(got)}"
            )
    if two_i % 2 or intermediate % MXFP4_BLOCK:
        raise ValueError(f"the intermediate size must be a multiple of 32 for MXFP4, got {intermediate}")
    for name, t in (("gate_up_scales", gate_up_scales), ("down_scales", down_scales)):
        if t.dtype != torch.uint8:
            raise TypeError(f"{name} must be uint8 (E8M0), got {t.dtype}")
    return num_experts, hidden, intermediate


def _check_fp8_experts(x, w_gate_up, gate_up_scale_inv, w_down, down_scale_inv, block) -> tuple[int, int, int]:
    """(E, H, I) of block-scaled FP8 expert weights (`[E, out, in]`), with every shape and dtype checked."""
    for name, t in (("w_gate_up", w_gate_up), ("w_down", w_down)):
        if t.dtype != FP8_DTYPE or t.dim() != 3:
            raise ValueError(f"{name} must be float8_e4m3fn [experts, out, in], got {t.dtype} {list(t.shape)}")
    if w_gate_up.shape[1] % 2:
        raise ValueError(f"w_gate_up must be [experts, 2 * intermediate, hidden], got {list(w_gate_up.shape)}")
    num_experts, two_i, hidden = w_gate_up.shape
    intermediate = two_i // 2

    def blocks(n):
        return -(-n // block)

    expected = {
        "x": (x.shape, (x.shape[0], hidden)),
        "gate_up_scale_inv": (gate_up_scale_inv.shape, (num_experts, blocks(two_i), blocks(hidden))),
        "w_down": (w_down.shape, (num_experts, hidden, intermediate)),
        "down_scale_inv": (down_scale_inv.shape, (num_experts, blocks(hidden), blocks(intermediate))),
    }
    for name, (got, want) in expected.items():
        if tuple(got) != want:
            raise ValueError(f"{name} must be {list(want)} for w_gate_up {list(w_gate_up.shape)}, got {list(got)}")
    for name, t in (("gate_up_scale_inv", gate_up_scale_inv), ("down_scale_inv", down_scale_inv)):
        if t.dtype != torch.float32:
            raise TypeError(f"{name} must be float32, got {t.dtype}")
    return num_experts, hidden, intermediate


# PyTorch reference


def swiglu_reference(gate_up: torch.Tensor, alpha: float = SWIGLU_ALPHA, limit: float = SWIGLU_LIMIT) -> torch.Tensor:
    """gpt-oss's activation on interleaved `[..., 2I]` gate/up, in transformers' op order."""
    gate, up = gate_up[..., ::2], gate_up[..., 1::2]
    gate = gate.clamp(min=None, max=limit)
    up = up.clamp(min=-limit, max=limit)
    glu = gate * torch.sigmoid(gate * alpha)
    return (up + 1) * glu


def silu_halves_reference(gate_up: torch.Tensor) -> torch.Tensor:
    """DeepSeek's activation on `[..., 2I]` = [gate | up]: silu(gate) * up."""
    gate, up = gate_up.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


def _activation_fn(activation: str, alpha: float, limit: float) -> Callable[[torch.Tensor], torch.Tensor]:
    if _activation_code(activation) == ACTIVATIONS["silu"]:
        return silu_halves_reference
    return lambda gate_up: swiglu_reference(gate_up, alpha, limit)


def _experts_reference(
    x: torch.Tensor,
    gate_up_of: Callable[[int], torch.Tensor],
    b_gate_up: torch.Tensor | None,
    down_of: Callable[[int], torch.Tensor],
    b_down: torch.Tensor | None,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    num_experts: int,
    act: Callable[[torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """The loop over the experts that are hit, as transformers' grouped_mm path runs it: the slots
    sorted by expert, per expert `rows @ W + b`, the activation `act`, `@ Wd + bd`, times the
    routing weight; the slots back in (token, k) order and summed over k in the product's dtype (fp32
    with the router's fp32 weights). A slot of id -1 (no expert of this rank's) contributes 0.
    Biases may be None. One host sync (the per-expert counts)."""
    num_tokens, top_k = topk_ids.shape
    flat_ids = topk_ids.reshape(-1).long()
    if flat_ids.numel() and not -1 <= int(flat_ids.min()) <= int(flat_ids.max()) < num_experts:
        raise ValueError(
            f"topk_ids must lie in [-1, {num_experts}) (-1: no expert), got {flat_ids.min()}..{flat_ids.max()}"
        )
    order = torch.argsort(flat_ids, stable=True)  # the -1 slots first
    none, *counts = torch.bincount(flat_ids + 1, minlength=num_experts + 1).tolist()
    rows = x[order // top_k]
    weights = topk_weights.reshape(-1)[order, None]
    out = torch.empty(
        num_tokens * top_k, x.shape[1], dtype=torch.promote_types(x.dtype, topk_weights.dtype), device=x.device
    )
    out[order[:none]] = 0
    start = none
    for expert, count in enumerate(counts):
        if count == 0:
            continue
        end = start + count
        gate_up = rows[start:end] @ gate_up_of(expert)
        if b_gate_up is not None:
            gate_up = gate_up + b_gate_up[expert]
        y = act(gate_up) @ down_of(expert)
        if b_down is not None:
            y = y + b_down[expert]
        out[order[start:end]] = y * weights[start:end]
        start = end
    return out.view(num_tokens, top_k, -1).sum(dim=1).to(x.dtype)


def fused_moe_reference(
    x: torch.Tensor,
    w_gate_up: torch.Tensor,
    b_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    b_down: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    alpha: float = SWIGLU_ALPHA,
    limit: float = SWIGLU_LIMIT,
    activation: str = "gpt_oss",
) -> torch.Tensor:
    """`[T, H]` in x's dtype; computes in the weights' dtype (as transformers does), so give it
    fp32 tensors for an fp32 reference. `activation`: "gpt_oss" (alpha, limit) or "silu"; the
    biases may be None."""
    _check_routing(x, topk_weights, topk_ids)
    num_experts, _, _ = _check_dense(x, w_gate_up, b_gate_up, w_down, b_down)
    return _experts_reference(
        x,
        w_gate_up.__getitem__,
        b_gate_up,
        w_down.__getitem__,
        b_down,
        topk_weights,
        topk_ids,
        num_experts,
        _activation_fn(activation, alpha, limit),
    )


def fused_moe_mxfp4_reference(
    x: torch.Tensor,
    gate_up_blocks: torch.Tensor,
    gate_up_scales: torch.Tensor,
    b_gate_up: torch.Tensor,
    down_blocks: torch.Tensor,
    down_scales: torch.Tensor,
    b_down: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    alpha: float = SWIGLU_ALPHA,
    limit: float = SWIGLU_LIMIT,
) -> torch.Tensor:
    """`fused_moe_reference` on the MXFP4 weights dequantized to x's dtype (exact for fp32 and
    bf16), one hit expert at a time, transposed to the dense `[in, out]` layout."""
    _check_routing(x, topk_weights, topk_ids)
    num_experts, _, _ = _check_mxfp4_experts(
        x, gate_up_blocks, gate_up_scales, b_gate_up, down_blocks, down_scales, b_down
    )
    return _experts_reference(
        x,
        lambda e: dequantize_mxfp4(gate_up_blocks[e], gate_up_scales[e], x.dtype).T,
        b_gate_up.to(x.dtype),
        lambda e: dequantize_mxfp4(down_blocks[e], down_scales[e], x.dtype).T,
        b_down.to(x.dtype),
        topk_weights,
        topk_ids,
        num_experts,
        _activation_fn("gpt_oss", alpha, limit),
    )


def fused_moe_fp8_reference(
    x: torch.Tensor,
    w_gate_up: torch.Tensor,
    gate_up_scale_inv: torch.Tensor,
    w_down: torch.Tensor,
    down_scale_inv: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    block: int = FP8_BLOCK,
) -> torch.Tensor:
    """DeepSeek's experts (silu, no biases) from block-scaled FP8 weights `[E, out, in]`, each hit
    expert dequantized (in fp32, then to x's dtype) and transposed to the dense `[in, out]` layout:
    `fused_moe_reference(..., activation="silu")` on those weights. fp32 x for an fp32 reference."""
    _check_routing(x, topk_weights, topk_ids)
    num_experts, _, _ = _check_fp8_experts(x, w_gate_up, gate_up_scale_inv, w_down, down_scale_inv, block)
    return _experts_reference(
        x,
        lambda e: dequantize_fp8(w_gate_up[e], gate_up_scale_inv[e], block, x.dtype).T,
        None,
        lambda e: dequantize_fp8(w_down[e], down_scale_inv[e], block, x.dtype).T,
        None,
        topk_weights,
        topk_ids,
        num_experts,
        silu_halves_reference,
    )


# Routing layout for the grouped GEMM


def max_padded_slots(num_slots: int, num_experts: int, block_m: int) -> int:
    """An upper bound on `num_tokens_post_padded`: at most min(slots, experts + 1) runs (the experts
    hit, and the -1 slots'), each padded by at most block_m - 1; rounded up to whole blocks."""
    bound = num_slots + min(num_slots, num_experts + 1) * (block_m - 1)
    return triton.cdiv(bound, block_m) * block_m


def moe_align_block_size(
    topk_ids: torch.Tensor, num_experts: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """vLLM's layout of the (token, k) slots for a grouped GEMM with BLOCK_M rows per program:

    - `sorted_token_ids` int32 `[max_padded_slots]`: slot ids (token * k + j) sorted by expert (in
      slot order within one), each expert's run padded to a multiple of block_m with the sentinel
      T*k, then the run of the slots whose id is -1 (no expert here), padded the same; entries past
      `num_tokens_post_padded` are the sentinel too.
    - `expert_ids` int32 `[max_padded_slots / block_m]`: the expert of each M-block; -1 for the
      blocks of the -1 slots' run (the kernel writes zeros for them) and past the end.
    - `num_tokens_post_padded` int32 `[1]`: the padded length, the -1 run included (on the device:
      no host sync).

    Torch ops only (an argsort, a scatter-add histogram, a cumsum, a searchsorted), none of which
    waits for the GPU, and every shape fixed by (T, k, E, block_m): CUDA-graph safe. Experts hit by
    no slot get no block, nor does the -1 run when no id is -1. Ids must lie in [-1, E) (unchecked:
    a check would sync)."""
    device = topk_ids.device
    flat = topk_ids.reshape(-1).long()
    flat = torch.where(flat < 0, num_experts, flat)  # -1: a last bucket, E, after the experts
    num_slots = flat.numel()
    capacity = max_padded_slots(num_slots, num_experts, block_m)
    counts = torch.zeros(num_experts + 1, dtype=torch.int64, device=device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    padded_ends = torch.cumsum((counts + block_m - 1) // block_m * block_m, dim=0)
    padded_starts = padded_ends - (counts + block_m - 1) // block_m * block_m
    order = torch.argsort(flat, stable=True)
    sorted_experts = flat[order]
    first_of_expert = torch.cumsum(counts, dim=0) - counts  # unpadded start of each expert's run
    rank = torch.arange(num_slots, device=device) - first_of_expert[sorted_experts]
    sorted_token_ids = torch.full((capacity,), num_slots, dtype=torch.int32, device=device)
    sorted_token_ids[padded_starts[sorted_experts] + rank] = order.to(torch.int32)
    block_starts = torch.arange(0, capacity, block_m, device=device)
    expert_ids = torch.searchsorted(padded_ends, block_starts, right=True)
    expert_ids = torch.where(expert_ids < num_experts, expert_ids, -1).to(torch.int32)  # -1 run; past the end
    num_tokens_post_padded = padded_ends[-1:].to(torch.int32)
    return sorted_token_ids, expert_ids, num_tokens_post_padded


# Triton


@triton.jit
def _fused_moe_kernel(
    a_ptr,
    b_ptr,
    scales_ptr,
    bias_ptr,
    c_ptr,
    topk_weights_ptr,
    sorted_token_ids_ptr,
    expert_ids_ptr,
    num_tokens_post_padded_ptr,
    N,
    K,
    num_slots,
    num_m_blocks,
    stride_am,
    stride_ak,
    stride_be,
    stride_bk,
    stride_bn,
    stride_se,
    stride_sn,
    stride_sk,
    stride_bias_e,
    stride_bias_n,
    stride_cm,
    stride_cn,
    alpha,
    limit,
    TOP_K: tl.constexpr,
    ACTIVATION: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    MUL_ROUTED_WEIGHT: tl.constexpr,
    MXFP4: tl.constexpr,
    FP8_BLOCK: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    """C[slot, n] for the slots of one M-block (one expert) and BLOCK_N outputs n < N. Rows of A
    are `slot // TOP_K`. Dense B is `[E, K, *]` by strides (FP8 B too, with FP8_BLOCK the scale
    block and scales `[E, rows / FP8_BLOCK, K / FP8_BLOCK]`); MXFP4 B is `[E, rows, K/2]` bytes with
    scales `[E, rows, K/32]`. ACTIVATION 1 (gpt-oss): output n reads B's columns (rows for MXFP4) 2n
    (gate) and 2n + 1 (up), adds their biases and applies the clamped SwiGLU; 2 (silu): columns n
    (gate) and N + n (up), silu(gate) * up; 0: output n is column n, plus its bias, times the slot's
    routing weight if MUL_ROUTED_WEIGHT. HAS_BIAS: whether there are biases. An M-block of expert -1
    (slots of no expert here) stores zeros to its slots' rows and reads no weights."""
    # Grouped order: GROUP_M M-blocks share each N-block's weights while they are in L2.
    pid = tl.program_id(0)
    num_n_blocks = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * num_n_blocks
    first_m = (pid // per_group) * GROUP_M
    group_size = tl.minimum(num_m_blocks - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_size
    pid_n = (pid % per_group) // group_size
    if pid_m * BLOCK_M >= tl.load(num_tokens_post_padded_ptr):
        return

    slots = tl.load(sorted_token_ids_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    slot_mask = slots < num_slots
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    c_ptrs = c_ptr + slots[:, None] * stride_cm + offs_n[None, :] * stride_cn
    c_mask = slot_mask[:, None] & n_mask[None, :]
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    if expert == -1:  # slots of no expert here (another rank's): they contribute 0
        tl.store(c_ptrs, tl.zeros((BLOCK_M, BLOCK_N), dtype=c_ptr.dtype.element_ty), mask=c_mask)
        return
    a_rows = tl.where(slot_mask, slots // TOP_K, 0)
    if ACTIVATION == 1:
        cols = 2 * offs_n  # gate; up is the next column
        up_cols = cols + 1
    else:
        cols = offs_n
        up_cols = offs_n + N  # silu's up half (unread without an activation)
    b_expert = b_ptr + expert * stride_be
    scales_expert = scales_ptr + expert * stride_se  # MXFP4 and FP8 only
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    a_row_ptrs = a_ptr + a_rows[:, None] * stride_am
    for k0 in range(0, K, BLOCK_K):
        if MXFP4:
            # Even and odd k apart: the low and the high nibbles of each weight byte.
            k_even = k0 + 2 * tl.arange(0, BLOCK_K // 2)
            a_mask = slot_mask[:, None] & (k_even < K)[None, :]
            a_even = tl.load(a_row_ptrs + k_even[None, :] * stride_ak, mask=a_mask, other=0.0)
            a_odd = tl.load(a_row_ptrs + (k_even + 1)[None, :] * stride_ak, mask=a_mask, other=0.0)
            if UPCAST_DOT:
                a_even, a_odd = a_even.to(tl.float32), a_odd.to(tl.float32)
            w_even, w_odd = mxfp4_weight_tiles(
                b_expert, scales_expert, cols, n_mask, k0, K, stride_bn, stride_sn, BLOCK_K
            )
            acc = tl.dot(a_even, w_even.to(a_even.dtype), acc, input_precision="ieee")
            acc = tl.dot(a_odd, w_odd.to(a_odd.dtype), acc, input_precision="ieee")
            if ACTIVATION != 0:
                w_even, w_odd = mxfp4_weight_tiles(
                    b_expert, scales_expert, up_cols, n_mask, k0, K, stride_bn, stride_sn, BLOCK_K
                )
                acc_up = tl.dot(a_even, w_even.to(a_even.dtype), acc_up, input_precision="ieee")
                acc_up = tl.dot(a_odd, w_odd.to(a_odd.dtype), acc_up, input_precision="ieee")
        else:
            offs_k = k0 + tl.arange(0, BLOCK_K)
            k_mask = offs_k < K
            a = tl.load(a_row_ptrs + offs_k[None, :] * stride_ak, mask=slot_mask[:, None] & k_mask[None, :], other=0.0)
            if UPCAST_DOT:
                a = a.to(tl.float32)
            b_mask = k_mask[:, None] & n_mask[None, :]
            b_k = b_expert + offs_k[:, None] * stride_bk
            # FP8 to a's dtype is exact; dense weights already have it (or are upcast with it).
            b = tl.load(b_k + cols[None, :] * stride_bn, mask=b_mask, other=0.0).to(a.dtype)
            if FP8_BLOCK:
                # One scale per output column for this K step (BLOCK_K divides FP8_BLOCK).
                scales_k = scales_expert + (k0 // FP8_BLOCK) * stride_sk
                s = tl.load(scales_k + (cols // FP8_BLOCK) * stride_sn, mask=n_mask, other=0.0)
                acc += tl.dot(a, b, input_precision="ieee") * s[None, :]
            else:
                acc = tl.dot(a, b, acc, input_precision="ieee")
            if ACTIVATION != 0:
                b_up = tl.load(b_k + up_cols[None, :] * stride_bn, mask=b_mask, other=0.0).to(a.dtype)
                if FP8_BLOCK:
                    s_up = tl.load(scales_k + (up_cols // FP8_BLOCK) * stride_sn, mask=n_mask, other=0.0)
                    acc_up += tl.dot(a, b_up, input_precision="ieee") * s_up[None, :]
                else:
                    acc_up = tl.dot(a, b_up, acc_up, input_precision="ieee")

    if HAS_BIAS:
        bias_expert = bias_ptr + expert * stride_bias_e
        acc += tl.load(bias_expert + cols * stride_bias_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
        if ACTIVATION != 0:
            acc_up += tl.load(bias_expert + up_cols * stride_bias_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    if ACTIVATION == 1:
        gate = tl.minimum(acc, limit)
        up = tl.minimum(tl.maximum(acc_up, -limit), limit)
        acc = (up + 1.0) * (gate * tl.sigmoid(gate * alpha))
    elif ACTIVATION == 2:
        acc = acc * tl.sigmoid(acc) * acc_up
    if MUL_ROUTED_WEIGHT:
        routed = tl.load(topk_weights_ptr + slots, mask=slot_mask, other=0.0).to(tl.float32)
        acc = acc * routed[:, None]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=c_mask)


def moe_tile_config(num_slots: int, num_experts: int, dtype: torch.dtype, mxfp4: bool) -> dict:
    """Tile sizes for the fused MoE launchers: few slots per expert (decode) get 16-row tiles,
    narrow N tiles (more programs to stream the few experts' weights: at one token, 4 experts x 90
    N-blocks) and long K steps; many slots per expert get 64 x 64 tiles. fp32 operands get smaller
    tiles (shared memory). `mxfp4` is there for tuning; the same tiles serve both today, and FP8
    (every block_k here divides its 128). Untuned: the GPU check's benchmark is where to tune them."""
    per_expert = num_slots / max(1, num_experts)
    if dtype == torch.float32:
        config = dict(block_m=16 if per_expert <= 16 else 32, block_n=32, block_k=32, num_stages=2)
    elif per_expert <= 16:
        config = dict(block_m=16, block_n=32, block_k=128, num_stages=4)
    else:
        config = dict(block_m=64, block_n=64, block_k=64, num_stages=3)
    return config | dict(group_m=8, num_warps=4)


def _launch(
    a: torch.Tensor,
    b: torch.Tensor,
    scales: torch.Tensor | None,
    bias: torch.Tensor | None,
    c: torch.Tensor,
    topk_weights: torch.Tensor | None,
    routing: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    n: int,
    k: int,
    num_slots: int,
    top_k: int,
    activation: int,
    config: dict,
    alpha: float,
    limit: float,
    fmt: str,
    fp8_block: int = 0,
) -> None:
    """One launch of `_fused_moe_kernel`. `fmt`: "dense" (`b [E, K, N']` by strides), "mxfp4"
    (`b` blocks `[E, N', K/32, 16]` with `scales`) or "fp8" (`b [E, N', K]` with block `scales`);
    `activation`: the kernel's code (0 none, else ACTIVATIONS')."""
    sorted_token_ids, expert_ids, num_tokens_post_padded = routing
    num_m_blocks = expert_ids.numel()
    if fmt == "mxfp4":
        bytes_ = b.flatten(2)  # [E, rows, K/2]
        scales = scales.flatten(2) if scales.dim() > 3 else scales
        assert bytes_.stride(2) == 1 and scales.stride(2) == 1, "MXFP4 blocks and scales must be contiguous"
        b_strides = (bytes_.stride(0), 1, bytes_.stride(1))
        s_strides = (scales.stride(0), scales.stride(1), 1)
        b = bytes_
    elif fmt == "fp8":
        b_strides = (b.stride(0), b.stride(2), b.stride(1))  # [E, out, in]: k runs along the last dim
        s_strides = (scales.stride(0), scales.stride(1), scales.stride(2))
    else:
        b_strides = (b.stride(0), b.stride(1), b.stride(2))
        s_strides = (0, 0, 0)
    bias_strides = (bias.stride(0), bias.stride(1)) if bias is not None else (0, 0)
    grid = (num_m_blocks * triton.cdiv(n, config["block_n"]),)
    _fused_moe_kernel[grid](
        a,
        b,
        scales if scales is not None else b,  # not read when dense
        bias if bias is not None else c,  # not read without HAS_BIAS
        c,
        topk_weights if topk_weights is not None else c,  # not read without MUL_ROUTED_WEIGHT
        sorted_token_ids,
        expert_ids,
        num_tokens_post_padded,
        n,
        k,
        num_slots,
        num_m_blocks,
        a.stride(0),
        a.stride(1),
        *b_strides,
        *s_strides,
        *bias_strides,
        c.stride(0),
        c.stride(1),
        alpha,
        limit,
        TOP_K=top_k,
        ACTIVATION=activation,
        HAS_BIAS=bias is not None,
        MUL_ROUTED_WEIGHT=topk_weights is not None,
        MXFP4=fmt == "mxfp4",
        FP8_BLOCK=fp8_block if fmt == "fp8" else 0,
        UPCAST_DOT=upcast_dot_operands(a.dtype),
        BLOCK_M=config["block_m"],
        BLOCK_N=config["block_n"],
        BLOCK_K=config["block_k"],
        GROUP_M=config["group_m"],
        num_warps=config["num_warps"],
        num_stages=config["num_stages"],
    )


def _fused_moe(
    x,
    fmt,
    gate_up,
    gate_up_scales,
    b_gate_up,
    down,
    down_scales,
    b_down,
    topk_weights,
    topk_ids,
    dims,
    activation,
    alpha,
    limit,
    config,
    fp8_block=0,
) -> torch.Tensor:
    num_experts, hidden, intermediate = dims
    num_tokens, top_k = topk_ids.shape
    num_slots = num_tokens * top_k
    mxfp4 = fmt == "mxfp4"
    config = moe_tile_config(num_slots, num_experts, x.dtype, mxfp4) | (config or {})
    if mxfp4 and config["block_k"] % MXFP4_BLOCK:
        raise ValueError(f"block_k must be a multiple of {MXFP4_BLOCK} for MXFP4, got {config['block_k']}")
    if fmt == "fp8" and fp8_block % config["block_k"]:
        raise ValueError(f"block_k must divide the FP8 scale block {fp8_block}, got {config['block_k']}")
    for name in ("block_m", "block_n", "block_k"):
        check_dot_dim(name, config[name] // 2 if name == "block_k" and mxfp4 else config[name])
    if x.stride(-1) != 1:
        x = x.contiguous()
    if num_tokens == 0:
        return torch.empty(0, hidden, dtype=x.dtype, device=x.device)
    routing = moe_align_block_size(topk_ids, num_experts, config["block_m"])
    act = torch.empty(num_slots, intermediate, dtype=x.dtype, device=x.device)
    common = dict(routing=routing, num_slots=num_slots, config=config, alpha=alpha, limit=limit, fmt=fmt)
    code = _activation_code(activation)
    _launch(
        x,
        gate_up,
        gate_up_scales,
        b_gate_up,
        act,
        None,
        n=intermediate,
        k=hidden,
        top_k=top_k,
        activation=code,
        fp8_block=fp8_block,
        **common,
    )
    weights = topk_weights.reshape(-1).to(torch.float32).contiguous()
    slots_out = torch.empty(num_slots, hidden, dtype=torch.float32, device=x.device)
    _launch(
        act,
        down,
        down_scales,
        b_down,
        slots_out,
        weights,
        n=hidden,
        k=intermediate,
        top_k=1,
        activation=0,
        fp8_block=fp8_block,
        **common,
    )
    return slots_out.view(num_tokens, top_k, hidden).sum(dim=1).to(x.dtype)


def fused_moe_triton(
    x: torch.Tensor,
    w_gate_up: torch.Tensor,
    b_gate_up: torch.Tensor | None,
    w_down: torch.Tensor,
    b_down: torch.Tensor | None,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    alpha: float = SWIGLU_ALPHA,
    limit: float = SWIGLU_LIMIT,
    config: dict | None = None,
    activation: str = "gpt_oss",
) -> torch.Tensor:
    """The Triton kernels behind `fused_moe_reference`'s interface (dense weights of x's dtype,
    biases of any float dtype or None, `activation` "gpt_oss" or "silu"). `config`: tile overrides
    (block_m, block_n, block_k, group_m, num_warps, num_stages) over `moe_tile_config`'s."""
    _check_routing(x, topk_weights, topk_ids)
    dims = _check_dense(x, w_gate_up, b_gate_up, w_down, b_down)
    if w_gate_up.dtype != x.dtype or w_down.dtype != x.dtype:
        raise TypeError(f"the expert weights must have x's dtype {x.dtype}, got {w_gate_up.dtype} and {w_down.dtype}")
    _activation_code(activation)
    return _fused_moe(
        x,
        "dense",
        w_gate_up,
        None,
        b_gate_up,
        w_down,
        None,
        b_down,
        topk_weights,
        topk_ids,
        dims,
        activation,
        alpha,
        limit,
        config,
    )


def fused_moe_mxfp4_triton(
    x: torch.Tensor,
    gate_up_blocks: torch.Tensor,
    gate_up_scales: torch.Tensor,
    b_gate_up: torch.Tensor,
    down_blocks: torch.Tensor,
    down_scales: torch.Tensor,
    b_down: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    alpha: float = SWIGLU_ALPHA,
    limit: float = SWIGLU_LIMIT,
    config: dict | None = None,
) -> torch.Tensor:
    """The Triton kernels behind `fused_moe_mxfp4_reference`'s interface: the MXFP4 weights are
    decoded inside the K loop (block_k a multiple of 32)."""
    _check_routing(x, topk_weights, topk_ids)
    dims = _check_mxfp4_experts(x, gate_up_blocks, gate_up_scales, b_gate_up, down_blocks, down_scales, b_down)
    return _fused_moe(
        x,
        "mxfp4",
        gate_up_blocks,
        gate_up_scales,
        b_gate_up,
        down_blocks,
        down_scales,
        b_down,
        topk_weights,
        topk_ids,
        dims,
        "gpt_oss",
        alpha,
        limit,
        config,
    )


def fused_moe_fp8_triton(
    x: torch.Tensor,
    w_gate_up: torch.Tensor,
    gate_up_scale_inv: torch.Tensor,
    w_down: torch.Tensor,
    down_scale_inv: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    block: int = FP8_BLOCK,
    config: dict | None = None,
) -> torch.Tensor:
    """The Triton kernels behind `fused_moe_fp8_reference`'s interface (x bf16, fp16 or fp32): the
    FP8 weights are read as stored, `[E, out, in]`, and scaled per block inside the K loop (block_k
    divides `block`)."""
    _check_routing(x, topk_weights, topk_ids)
    dims = _check_fp8_experts(x, w_gate_up, gate_up_scale_inv, w_down, down_scale_inv, block)
    return _fused_moe(
        x,
        "fp8",
        w_gate_up,
        gate_up_scale_inv,
        None,
        w_down,
        down_scale_inv,
        None,
        topk_weights,
        topk_ids,
        dims,
        "silu",
        SWIGLU_ALPHA,
        SWIGLU_LIMIT,
        config,
        fp8_block=block,
    )
