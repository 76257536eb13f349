"""Runs the model on a scheduled batch: owns the weights and the KV-cache pool; `prepare` turns the
batch into a StepInput (token ids, positions, slot mapping, block tables: plain tensors) and
`execute` runs the forward on it and returns the logits of the rows the batch wants."""

from itertools import chain

import numpy as np
import torch

from kernels import paged_attention_triton, select_ops
from kernels.decode_attention import MAX_SPLITS, decode_attention_triton
from sut.batch import ScheduledBatch
from sut.config import EngineConfig, ModelConfig
from sut.cpu.backend import setup_cpu_backend
from sut.errors import ConfigError
from sut.model.deepseek_mtp import load_mtp_layer
from sut.model.loader import forward_weight_bytes, load_model
from sut.parallel import Shard, broadcast, broadcast_tensor, local_config
from sut.sample.sampler import sample
from sut.sample.verifier import verify
from sut.sequence import Sequence
from sut.worker.cuda_graphs import DecodeGraphs
from sut.worker.kv_cache import (
    blocks_from_memory,
    check_holds_one_sequence,
    kv_bytes_per_block,
    kv_entry,
    kv_layer_slots,
    kv_window,
)
from sut.worker.step_input import DraftStep, StepInput


class ModelRunner:
    def __init__(
        self,
        model_path,
        model_config: ModelConfig,
        config: EngineConfig,
        max_model_len: int,
        dtype: torch.dtype,
        device: torch.device,
        num_blocks: int | None = None,
        draft: tuple[ModelConfig, int] | None = None,
        model=None,
        shard: Shard | None = None,
    ):
        """`num_blocks`: the KV pool's size (a draft model's runner takes the target's, to share its
        block tables); by default from the settings or the memory free, shared with `draft` (a draft
        model's config and weight bytes, loaded after this runner) where there is one. `model`: one
        already built (random weights, for a benchmark) in place of loading `model_path`'s. `shard`:
        a tensor-parallel rank's part of the model and its KV cache; rank 0's runner broadcasts each
        step input to the other ranks' (sut/parallel/)."""
        self.device, self.block_size, self.shard = device, config.block_size, shard
        if device.type == "cuda" and device.index is not None:
            torch.cuda.set_device(device)  # Triton launches on the current device, whatever its pointers
        self._load_weights(model_path, model_config, config, dtype, model)
        local = model_config if shard is None else local_config(model_config, shard.size)  # this rank's part
        self._select_backend(model_path, local, config)
        self._allocate_kv_cache(local, config, max_model_len, dtype, num_blocks, draft)
        self._prepare_fast_decode(config, max_model_len)

    def _load_weights(self, model_path, model_config: ModelConfig, config: EngineConfig, dtype, model) -> None:
        """The model (`model` where one is given), DeepSeek's MTP module where the engine drafts with
        it, and the weights' bytes as loaded."""
        self.model = (
            model
            if model is not None
            else load_model(model_path, model_config, dtype, self.device, self.shard, quantization=config.quantization)
        )
        spec = config.speculative_config
        # DeepSeek's MTP module drafts with the target's embedding, rope and LM head, and under tensor
        # parallelism its forwards are collectives beside the target's: every rank holds its part.
        self.mtp = (
            load_mtp_layer(model_path, model_config, dtype, self.device, self.shard)
            if spec is not None and spec.method == "mtp"
            else None
        )
        self.weight_bytes = sum(p.numel() * p.element_size() for p in self.model.parameters())  # before packing

    def _select_backend(self, model_path, c: ModelConfig, config: EngineConfig) -> None:
        """The op set the model runs (`model.ops`), and on CPU the CPU backend that readies the model
        (`cpu`); `c`: this rank's part of the model's config."""
        # On CPU the CPU backend (sut/cpu/) readies the model and offers its op set to the one backend
        # switch (for a tensor-parallel rank, only what works on its slices).
        # (Weights quantized at load no longer match the folder's GGUF blocks: none of those then.)
        blocks_folder = model_path if config.quantization is None else None
        self.cpu = (
            setup_cpu_backend(self.model, blocks_folder, config.cpu, sliced=self.shard is not None)
            if self.device.type == "cpu"
            else None
        )
        # The report's bound on a step (harness/measure/roofline.py): the weights it must read at least, and
        # the decoder layers' linear FLOPs per token (attention's and the LM head's left out: a bound).
        self.weight_bytes_read = self.cpu.weight_bytes_read if self.cpu else forward_weight_bytes(self.model)
        self.flops_per_token = layer_linear_flops(c)
        try:
            self.model.ops = select_ops(self.device.type, config.kernels, self.cpu and self.cpu.ops)
        except ValueError as e:  # kernels knows nothing of the engine's errors
            raise ConfigError(f"engine setting {e}") from None

    def _allocate_kv_cache(
        self,
        c: ModelConfig,
        config: EngineConfig,
        max_model_len: int,
        dtype: torch.dtype,
        num_blocks: int | None,
        draft: tuple[ModelConfig, int] | None,
    ) -> None:
        """The KV pool, sized (sut/worker/kv_cache.py) and zeroed, so that stale slots are finite
        numbers even where a kernel reads and masks them; each layer's view of it; and the MTP module's
        own cache. `c`: this rank's part of the model's config."""
        # Sliding-window layers beside full ones: two block tables per sequence from one pool, a
        # block holding one group's layers (sut/engine/block_manager.py); else one table, None here.
        self.kv_window = kv_window(c)
        self.bytes_per_block = kv_bytes_per_block(c, config.block_size, dtype)
        self.num_blocks = (
            num_blocks
            or config.num_kv_blocks
            or blocks_from_memory(config, c, dtype, self.device, self.cpu and self.cpu.kv_cache_bytes, draft)
        )
        check_holds_one_sequence(c, self.num_blocks, self.block_size, max_model_len, config.max_num_batched_tokens)
        slots = kv_layer_slots(c)
        tensors, heads, dim = kv_entry(c)
        shape = (self.num_blocks, self.block_size, heads, dim)
        self.kv_cache = torch.zeros(tensors, max(slots) + 1, *shape, dtype=dtype, device=self.device)
        for slot, layer in zip(slots, self.model.model.layers):
            layer.self_attn.k_cache = self.kv_cache[0, slot]
            # Latent attention caches one entry a token, whose first dims (the latent) are its values.
            layer.self_attn.v_cache = (
                self.kv_cache[1, slot] if tensors == 2 else self.kv_cache[0, slot][..., : c.mla.kv_lora_rank]
            )
        if self.mtp is not None:  # its own one-layer latent cache, indexed by the target's block tables
            self.mtp_kv_cache = torch.zeros(tensors, 1, *shape, dtype=dtype, device=self.device)
            self.mtp.self_attn.k_cache = self.mtp_kv_cache[0, 0]
            self.mtp.self_attn.v_cache = self.mtp_kv_cache[0, 0][..., : c.mla.kv_lora_rank]

    def _prepare_fast_decode(self, config: EngineConfig, max_model_len: int) -> None:
        """Decode-only steps in one C call where the CPU backend can (`cpu_decoder`, None elsewhere:
        its `.forward` gives the step's hidden states, or None for a step it does not take; with
        speculation it also takes steps that verify drafts, k + 1 query rows a sequence), and with
        `cuda_graphs` replayed from CUDA graphs (`graphs`). Both hold pointers to the KV cache."""
        spec = config.speculative_config
        self.cpu_decoder = self.cpu and self.cpu.decoder(1 + (spec.num_speculative_tokens if spec else 0))
        self.graphs = None
        if config.cuda_graphs:
            if self.device.type != "cuda":
                raise ConfigError(f"engine setting cuda_graphs needs a CUDA device, not {self.device}")
            self.graphs = DecodeGraphs(
                self.model,
                config.max_num_seqs,
                -(-max_model_len // self.block_size),
                max_model_len,
                self.device,
                window=self.kv_window is not None,
            )

    def prepare(self, batch: ScheduledBatch) -> StepInput:
        """The step input of `batch`: each sequence's uncomputed tokens, then its drafts."""
        seqs = batch.seqs
        starts = [s.num_computed_tokens for s in seqs]
        tokens = [
            s.token_slice(a, a + n - d) + s.spec_token_ids if d else s.token_slice(a, a + n)
            for s, a, n, d in zip(seqs, starts, batch.num_new_tokens, batch.num_draft)
        ]
        return self.prepare_tokens(seqs, tokens, starts, batch.num_logits, batch.block_tables, batch.window_tables)

    def prepare_tokens(
        self,
        seqs: list[Sequence],
        tokens: list[list[int]],
        starts: list[int],
        num_logits: list[int],
        block_tables: np.ndarray,
        window_tables: np.ndarray | None = None,
    ) -> StepInput:
        """The step input that computes `tokens[i]` of `seqs[i]` at positions from `starts[i]` on, in its
        blocks (rows of `block_tables`, and of `window_tables` for window layers where the model has
        them), wanting logits of the last `num_logits[i]`; built with array operations (one pass over
        the sequences, none over tokens)."""
        bs, num_seqs = self.block_size, len(seqs)
        query_lens_host = [len(t) for t in tokens]
        query_lens = np.array(query_lens_host, dtype=np.int64)
        starts = np.array(starts, dtype=np.int64)
        seq_lens = starts + query_lens
        cu_seqlens = np.zeros(num_seqs + 1, dtype=np.int64)
        np.cumsum(query_lens, out=cu_seqlens[1:])
        input_ids = np.fromiter(chain.from_iterable(tokens), np.int64, int(cu_seqlens[-1]))
        token_seq = np.repeat(np.arange(num_seqs), query_lens)  # the sequence of each token row
        positions = np.repeat(starts, query_lens) + _ranks(query_lens)
        rows = np.fromiter((s.block_row for s in seqs), np.int64, num_seqs)
        width = max(len(s.block_table) for s in seqs)
        block_tables = block_tables[rows, :width]
        slots = block_tables[token_seq, positions // bs].astype(np.int64) * bs + positions % bs
        window = {}
        if window_tables is not None:
            window_tables = window_tables[rows, :width]
            window_slots = window_tables[token_seq, positions // bs].astype(np.int64) * bs + positions % bs
            window = dict(
                window_slot_mapping=self._to_device(window_slots), window_block_tables=self._to_device(window_tables)
            )
        # Each sequence's wanted rows are its last num_logits tokens.
        num_logits = np.array(num_logits, dtype=np.int64)
        logits_indices = np.repeat(cu_seqlens[1:] - num_logits, num_logits) + _ranks(num_logits)
        return StepInput(
            input_ids=self._to_device(input_ids),
            positions=self._to_device(positions),
            slot_mapping=self._to_device(slots),
            block_tables=self._to_device(block_tables),
            cu_seqlens_q=self._to_device(cu_seqlens.astype(np.int32)),
            seq_lens=self._to_device(seq_lens.astype(np.int32)),
            logits_indices=self._to_device(logits_indices),
            query_lens_host=query_lens_host,
            seq_lens_host=seq_lens.tolist(),
            **window,
        )

    def _to_device(self, array: np.ndarray) -> torch.Tensor:
        tensor = torch.from_numpy(array)
        if self.device.type == "cpu":
            return tensor
        # Through pinned memory (torch's caching host allocator keeps it until the copy is done),
        # so the copy does not wait for the device.
        return tensor.pin_memory().to(self.device, non_blocking=True)

    def warmup_kernels(self) -> None:
        """On CUDA, the decode kernel at every split count a step may choose (each its own
        compilation); the engine's warm-up steps cover the rest. It only reads the cache."""
        if self.device.type != "cuda" or self.model.ops.paged_attention is not paged_attention_triton:
            return
        attn = self.model.model.layers[0].self_attn
        q = torch.zeros(1, attn.num_heads, attn.k_cache.shape[-1], dtype=attn.k_cache.dtype, device=self.device)
        tables = torch.zeros(1, 1, dtype=torch.int32, device=self.device)
        lens = torch.ones(1, dtype=torch.int32, device=self.device)
        splits = 1
        while splits <= MAX_SPLITS:
            decode_attention_triton(q, attn.k_cache, attn.v_cache, tables, lens, attn.scale, 1, num_splits=splits)
            splits *= 2

    def sample(
        self, logits: torch.Tensor, batch: ScheduledBatch, eos_token_ids, generator, verify_drafts: bool
    ) -> list[list[int] | None]:
        """The tokens each sequence of `batch` with logits emits, in batch order: one sampled token,
        or with `verify_drafts` its accepted drafts then one of the target's (rejection sampling, on
        this backend's kernel); None where its logits were NaN or inf."""
        if not verify_drafts:
            return [None if t is None else [t] for t in sample(logits, batch.sampling_seqs, eos_token_ids, generator)]
        return verify(logits, batch.sampling_seqs, eos_token_ids, generator, self.model.ops.rejection_sample)

    def execute(
        self, step: StepInput, aux_layers: tuple[int, ...] = ()
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Forward one step; return the fp32 logits `[num_logits, vocab]` of its wanted rows. With
        `aux_layers` (the target's layer boundaries an EAGLE3 head or the MTP module reads), return
        (logits, the residual stream at those boundaries for every token of the step,
        `[num_tokens, len(aux_layers) * hidden]`): the model's own forward keeps it, a CUDA graph or
        the one-call decoder does not, so such a step runs neither."""
        if self.shard is not None and self.shard.rank == 0:
            broadcast(step)  # the other ranks run the same forward on their shards
        meta = step.attention_metadata()
        if aux_layers:
            hidden, aux = self.model(step.input_ids, step.positions, meta, aux_layers)
            return self._logits(step, hidden), aux
        hidden = self.graphs.run(step) if self.graphs else None
        if hidden is None and self.cpu_decoder:
            hidden = self.cpu_decoder.forward(step.input_ids, step.positions, meta)
        if hidden is None:
            hidden = self.model(step.input_ids, step.positions, meta)
        return self._logits(step, hidden)

    def _logits(self, step: StepInput, hidden: torch.Tensor) -> torch.Tensor:
        if step.logits_indices.shape[0] == 0:
            return hidden.new_empty(0, self.model.config.vocab_size, dtype=torch.float32)
        return self.model.compute_logits(hidden[step.logits_indices])

    @torch.inference_mode()
    def execute_draft(self, step: StepInput, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Forward the MTP module over `step`'s rows, which read (token p + 1, the target-normed
        hidden state of p) from `hidden` `[num_tokens, H]`; return the fp32 logits of the wanted rows
        and the module's output there (chained, the next row's hidden state). Rank 0 sends both to
        the other ranks, which run it on their parts."""
        if self.shard is not None and self.shard.rank == 0:
            broadcast(DraftStep(step, tuple(hidden.shape), hidden.dtype))
            broadcast_tensor(hidden.contiguous())
        target = self.model
        rope = target.rotary(step.positions, hidden.dtype)
        meta = step.attention_metadata(with_window=False)
        out = self.mtp(target.embed(step.input_ids), hidden, rope, meta, target.ops)
        out = out[step.logits_indices]
        return target.compute_logits(out), out


def layer_linear_flops(c: ModelConfig) -> int:
    """Multiply-adds x 2 per token in the decoder layers' linears: q, k, v, o and gate, up, down (of
    each of a token's experts, its shared experts and the router, in a mixture of experts)."""
    attention = c.hidden_size * (2 * c.num_heads + 2 * c.num_kv_heads) * c.head_dim
    if c.mla is not None:  # the input's two projections, q_b, kv_b (as absorbed or expanded), o
        m = c.mla
        q = (
            m.q_lora_rank * (c.hidden_size + c.num_heads * (m.qk_nope_head_dim + m.qk_rope_head_dim))
            if m.q_lora_rank
            else c.hidden_size * c.num_heads * (m.qk_nope_head_dim + m.qk_rope_head_dim)
        )
        attention = (
            q
            + c.hidden_size * m.cache_dim
            + c.num_heads * (m.kv_lora_rank * (m.qk_nope_head_dim + m.v_head_dim) + m.v_head_dim * c.hidden_size)
        )
    dense = 3 * c.hidden_size * c.intermediate_size
    if c.moe is None:
        return 2 * c.num_layers * (attention + dense)
    per_expert = 3 * c.hidden_size * (c.moe.expert_intermediate_size or c.intermediate_size)
    # A tensor-parallel rank's config (parallel_size > 1): its share of the experts' work; the router whole.
    moe = (c.moe.experts_per_token + c.moe.shared_experts) * per_expert // c.moe.parallel_size
    moe += c.hidden_size * c.moe.num_experts
    dense_layers = c.moe.first_dense_layers
    return 2 * (c.num_layers * attention + dense_layers * dense + (c.num_layers - dense_layers) * moe)


def _ranks(counts: np.ndarray) -> np.ndarray:
    """0, 1, ..., c - 1 for each count c, one after the other: [2, 3] -> [0, 1, 0, 1, 2]."""
    return np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
