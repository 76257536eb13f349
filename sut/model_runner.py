"""Runs the model on a scheduled batch: owns the weights and the KV-cache pool, turns the batch
into flat input tensors (token ids, positions, slot mapping, block tables) and returns the
logits of the sequences that sample a token this step."""

import torch

from kernels import AttentionMetadata, select_ops
from sut.config import EngineConfig, ModelConfig
from sut.cpu.backend import setup_cpu_backend
from sut.errors import ConfigError
from sut.loader import load_model
from sut.scheduler import ScheduledBatch
from sut.sequence import Sequence


class ModelRunner:
    def __init__(self, model_path, model_config: ModelConfig, config: EngineConfig, max_model_len: int,
                 dtype: torch.dtype, device: torch.device):
        self.device = device
        self.block_size = config.block_size
        self.model = load_model(model_path, model_config, dtype, device)
        # On CPU the CPU backend (sut/cpu/) readies the model and offers its op set to the one backend switch.
        self.cpu = setup_cpu_backend(self.model, model_path, config.cpu) if device.type == "cpu" else None
        try:
            self.model.ops = select_ops(device.type, config.kernels, self.cpu and self.cpu.ops)
        except ValueError as e:  # kernels knows nothing of the engine's errors
            raise ConfigError(f"engine setting {e}") from None
        c = model_config
        self.bytes_per_block = 2 * c.num_layers * config.block_size * c.num_kv_heads * c.head_dim * dtype.itemsize
        self.num_blocks = config.num_kv_blocks or self._blocks_from_memory(config, model_config)
        if self.num_blocks * self.block_size < max_model_len:
            raise ConfigError(
                f"KV cache of {self.num_blocks} blocks x {self.block_size} tokens cannot hold one sequence of "
                f"max_model_len={max_model_len} tokens; raise num_kv_blocks / kv_cache_memory_gb or lower max_model_len")
        # Zeroed, so that stale slots are finite numbers even where a kernel reads and masks them.
        self.kv_cache = torch.zeros(2, c.num_layers, self.num_blocks, self.block_size, c.num_kv_heads, c.head_dim,
                                    dtype=dtype, device=device)
        for i, layer in enumerate(self.model.model.layers):
            layer.self_attn.k_cache = self.kv_cache[0, i]
            layer.self_attn.v_cache = self.kv_cache[1, i]
        # Decode-only steps in one C call where the CPU backend can (None elsewhere): `.forward` gives
        # the step's hidden states, or None for a step it does not take.
        self.cpu_decoder = self.cpu and self.cpu.decoder()

    def _blocks_from_memory(self, config: EngineConfig, mc: ModelConfig) -> int:
        if config.kv_cache_memory_gb is not None:
            budget = config.kv_cache_memory_gb * 2**30
        elif self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            # Leave room for one step's activations and logits (a generous estimate).
            activations = config.max_num_batched_tokens * (6 * mc.hidden_size + 3 * mc.intermediate_size) * 4
            logits = config.max_num_seqs * mc.vocab_size * 4 * 3
            budget = free - (1 - config.gpu_memory_utilization) * total - activations - logits
        else:
            budget = self.cpu.kv_cache_bytes
        return max(0, int(budget // self.bytes_per_block))

    def run(self, batch: ScheduledBatch) -> tuple[torch.Tensor, list[Sequence]]:
        """Forward the batch; return logits `[k, vocab]` (fp32) for the k sequences that reach their
        last token this step, and those sequences."""
        input_ids, positions, slots, seq_lens, query_lens, sample_rows, sample_seqs = [], [], [], [], [], [], []
        bs = self.block_size
        for seq, n in zip(batch.seqs, batch.num_new_tokens):
            start, end = seq.num_computed_tokens, seq.num_computed_tokens + n
            input_ids += seq.token_slice(start, end)
            positions += range(start, end)
            table = seq.block_table
            slots += [table[p // bs] * bs + p % bs for p in range(start, end)]
            query_lens.append(n)
            seq_lens.append(end)
            if end == seq.num_tokens:
                sample_rows.append(len(input_ids) - 1)
                sample_seqs.append(seq)
        max_blocks = max(len(seq.block_table) for seq in batch.seqs)
        block_tables = [seq.block_table + [0] * (max_blocks - len(seq.block_table)) for seq in batch.seqs]
        cu_seqlens = [0]
        for n in query_lens:
            cu_seqlens.append(cu_seqlens[-1] + n)

        def tensor(values, dtype=torch.int32):
            return torch.tensor(values, dtype=dtype).to(self.device, non_blocking=True)

        meta = AttentionMetadata(
            slot_mapping=tensor(slots, torch.int64), block_tables=tensor(block_tables), cu_seqlens_q=tensor(cu_seqlens),
            seq_lens=tensor(seq_lens), query_lens_host=query_lens, seq_lens_host=seq_lens,
        )
        ids, positions = tensor(input_ids, torch.int64), tensor(positions, torch.int64)
        hidden = self.cpu_decoder and self.cpu_decoder.forward(ids, positions, meta)
        if hidden is None:
            hidden = self.model(ids, positions, meta)
        if not sample_rows:
            return hidden.new_empty(0, 0, dtype=torch.float32), []
        return self.model.compute_logits(hidden[tensor(sample_rows, torch.int64)]), sample_seqs
