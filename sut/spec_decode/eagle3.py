"""An EAGLE3 head as proposer (Li et al., "EAGLE-3", 2025): one decoder layer that drafts from the
target's own hidden states. The checkpoint layout is the one vLLM's `llama_eagle3.py` and the
speculators library load, which is that of the MLPerf gpt-oss-120b reference's head
(nvidia/gpt-oss-120b-Eagle3-long-context, `LlamaForCausalLMEagle3`, num_steps 3, topk 1). A head
folder holds config.json and safetensors:

- `fc.weight` [H, n * Ht] joins the target's residual stream at n layer boundaries, each Ht wide
  (config `target_hidden_size`, else the head's H). The boundaries are the config's
  `eagle_aux_hidden_state_layer_ids` (top level, or in `eagle_config`), else vLLM's default
  (2, L // 2, L - 3) of a target of L layers. Boundary j is what enters target layer j: 0 the
  embeddings, L what leaves the last layer before the final norm (vLLM's indexing, and SGLang's for
  gpt-oss since its PR #32334; the nvidia long-context head names [1, 17, 32]). With
  `norm_before_fc`, an RMSNorm `input_norm.weight` [n * Ht] comes first.
- One Llama decoder layer, `midlayer.*` (or `layers.0.*`, as speculators writes it). Its attention
  reads cat(input_layernorm(embedding of the token), hidden_norm(hidden)), 2H wide, so q/k/v_proj
  take 2H. The residual is the hidden state before hidden_norm (after it with
  `norm_before_residual`, which speculators' configs default to); then post_attention_layernorm and
  the MLP, as in Llama.
- `norm.weight`, and `lm_head.weight` [Vd, H] over a draft vocabulary of `draft_vocab_size` tokens.
  `d2t` [Vd] maps them: target id = draft id + d2t[draft id] (absent when Vd is the vocabulary).
  `t2d` [V] is read by nothing. `embed_tokens.weight` [V, H] is there where the head has its own
  embedding; else it shares the target's.

Row p of the head reads (token p + 1, a hidden state of position p) and its normed output's LM head
predicts the token at p + 2. The hidden state is the target's (after fc) for positions the target
has verified, and the head's own output of the row before (before `norm`; after it with
`norm_output`, EAGLE 3.1) for the positions it drafts. So a proposal for a sequence of T tokens, whose
target cache holds T - 1, first runs the head over the positions it has not consumed (from
`seq.draft_num_computed` to T - 2: the verified tokens of the last step, or a whole prompt after
prefill) in one forward with every other sequence's, which gives draft 1, then one forward a draft.

The target's hidden states arrive through `observe`, after each step: the target's step returns those
of the head's boundaries for the step's tokens (`ModelRunner.execute` with the proposer's
`aux_layers`; only when this proposer is set), and each sequence keeps, fc
applied, the rows of the positions the target kept (`num_computed_tokens`; rejected drafts' rows
are dropped). A sequence whose state does not line up with its computed tokens (preempted and
recomputed, or admitted with K/V computed elsewhere) starts over from the step's first position.

The head has its own one-layer KV cache of the target's pool size, indexed by the target's
full-attention block table (`BlockManager.block_tables`, never a window table: vLLM PR #25406, whose
head used a gpt-oss window group's table and overwrote the target's cache) and slot mapping: the
scheduler reserved the slots it drafts into. It writes only its own tensors. Drafts are greedy
(the argmax, deterministic: no probabilities) or sampled with the request's temperature, top-k and
top-p from the head's distribution over the target vocabulary (zero off the draft vocabulary), which
the verifier receives so that rejection sampling stays exact."""

import dataclasses
import json
import weakref
from pathlib import Path

import numpy as np
import torch
from torch import nn

from kernels import TORCH_OPS, AttentionMetadata, KernelOps
from sut.config import ModelConfig
from sut.config.resolved import Eagle3Head
from sut.errors import CheckpointError, ConfigError
from sut.model.llama import FusedLinear, LlamaAttention, LlamaMLP, RMSNorm
from sut.model.loader import IGNORED_SUFFIXES, checkpoint_layout, read_header, weight_files
from sut.model.rope import RotaryEmbedding
from sut.sample.sampler import draw, sampling_probs, to_host
from sut.sequence import Sequence
from sut.spec_decode.proposer import sampling_settings
from sut.worker.step_input import StepInput

WHERE = "engine setting speculative_config.model"
# config.json `architectures` of a head in the flat layout (EAGLE's own, ModelOpt's, vLLM's name).
HEAD_ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")
LAYER_PREFIXES = ("midlayer.", "layers.0.")
FLOAT_DTYPES = ("F32", "F16", "BF16", "F64")
INT_DTYPES = ("I64", "I32")


def default_aux_layers(num_layers: int) -> tuple[int, ...]:
    """vLLM's boundaries for a head that names none: low, middle and high."""
    return (2, num_layers // 2, num_layers - 3)


# ---- the head folder, checked before any model loads -------------------------------------------


def check_eagle3_folder(folder: Path, target: ModelConfig, max_model_len: int) -> Eagle3Head:
    """The head's layout, after checking it can draft for `target`: its config (one Llama layer, the
    target's vocabulary and hidden size, boundaries inside the target) and every tensor by name, shape
    and dtype (and the draft-to-target map by value). Reads config.json, the safetensors headers and
    `d2t`; ConfigError naming what does not fit."""
    if not folder.is_dir():
        raise ConfigError(f"{WHERE}: EAGLE3 head folder {folder} does not exist")
    path = folder / "config.json"
    if not path.is_file():
        raise ConfigError(f"{WHERE}: {folder} has no config.json")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"{WHERE}: {path} is not valid JSON ({e})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{WHERE}: {path} is not a JSON object")
    layer_raw, speculators = _layer_section(raw, path)
    eagle = raw.get("eagle_config") or {}
    if not isinstance(eagle, dict):
        raise ConfigError(f"{WHERE}: {path}: eagle_config must be an object, got {eagle!r}")
    if eagle.get("use_aux_hidden_state", True) is not True:
        raise ConfigError(
            f"{WHERE}: {path} sets eagle_config.use_aux_hidden_state false: a head that reads only the "
            "target's last hidden state (EAGLE 1/2), not an EAGLE3 head"
        )
    if raw.get("fc_norm"):
        raise ConfigError(f"{WHERE}: {path} sets fc_norm (a norm per joined hidden state): not supported")
    if "sliding_attention" in (layer_raw.get("layer_types") or ()):
        raise ConfigError(f"{WHERE}: {path}: a head with a sliding-window layer (layer_types) is not supported")
    # speculators' nested layer config may leave the vocabulary to the top level
    vocab = layer_raw.get("vocab_size", raw.get("vocab_size"))
    try:
        layer = ModelConfig.from_dict(
            {**layer_raw, "architectures": ["LlamaForCausalLM"], "vocab_size": vocab}, str(path)
        )
    except ConfigError as e:
        raise ConfigError(f"{WHERE}: {e}") from None
    if layer.num_layers != 1:
        raise ConfigError(
            f"{WHERE}: {path} has num_hidden_layers={layer.num_layers}; an EAGLE3 head here has one decoder layer"
        )
    if layer.vocab_size != target.vocab_size:
        raise ConfigError(
            f"{WHERE}: the head {folder} has a vocabulary of {layer.vocab_size} tokens, the target "
            f"{target.vocab_size}: a head drafts in its target's vocabulary"
        )
    target_hidden = _positive_int(raw, "target_hidden_size", path, layer.hidden_size)
    if target_hidden != target.hidden_size:
        raise ConfigError(
            f"{WHERE}: the head {folder} reads hidden states {target_hidden} wide (target_hidden_size, else "
            f"hidden_size), and the target's are {target.hidden_size}: a head trained for another model"
        )
    draft_vocab = _positive_int(raw, "draft_vocab_size", path, layer.vocab_size)
    if draft_vocab > layer.vocab_size:
        raise ConfigError(f"{WHERE}: {path}: draft_vocab_size {draft_vocab} exceeds vocab_size {layer.vocab_size}")
    ids = raw.get("eagle_aux_hidden_state_layer_ids") or eagle.get("eagle_aux_hidden_state_layer_ids")
    named = bool(ids)
    ids = ids or default_aux_layers(target.num_layers)
    if not isinstance(ids, (list, tuple)) or not all(isinstance(j, int) and not isinstance(j, bool) for j in ids):
        raise ConfigError(f"{WHERE}: {path}: eagle_aux_hidden_state_layer_ids must be a list of integers, got {ids!r}")
    outside = [j for j in ids if not 0 <= j <= target.num_layers]
    if outside:
        how = "names" if named else "names none, and vLLM's default"
        raise ConfigError(
            f"{WHERE}: {path} {how} layer boundaries {list(ids)}; {outside} lie outside the target's "
            f"0..{target.num_layers} (boundary j: what enters layer j of {target.num_layers})"
        )
    flags = {
        name: _flag(raw, name, path, default)
        for name, default in (("norm_before_residual", speculators), ("norm_before_fc", False), ("norm_output", False))
    }
    # Rope tables as long as the engine's sequences: a head trained on shorter ones still drafts there.
    layer = dataclasses.replace(layer, max_position_embeddings=max(layer.max_position_embeddings, max_model_len))
    head = Eagle3Head(
        layer=layer,
        aux_layer_ids=tuple(ids),
        target_hidden_size=target_hidden,
        draft_vocab_size=draft_vocab,
        layer_prefix=LAYER_PREFIXES[0],
        own_embedding=False,
        has_d2t=False,
        **flags,
    )
    return _check_tensors(folder, head, target)


def _layer_section(raw: dict, path: Path) -> tuple[dict, bool]:
    """The decoder layer's config (speculators nests it under transformer_layer_config) and whether
    the folder is in speculators' layout."""
    nested = raw.get("transformer_layer_config")
    if isinstance(nested, dict):
        kind = raw.get("speculators_model_type")
        if kind != "eagle3":
            raise ConfigError(f"{WHERE}: {path}: speculators_model_type {kind!r}: not an EAGLE3 head ('eagle3')")
        return nested, True
    archs = raw.get("architectures") or []
    if not any(a in HEAD_ARCHITECTURES for a in archs):
        raise ConfigError(
            f"{WHERE}: {path.parent} is not an EAGLE3 head (architectures {archs}; a head names one of "
            f"{list(HEAD_ARCHITECTURES)}, or is in speculators' layout); a whole draft model goes with "
            "method 'draft_model'"
        )
    return raw, False


def _positive_int(raw: dict, key: str, path: Path, default: int) -> int:
    value = raw.get(key)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{WHERE}: {path}: {key} must be a positive integer, got {value!r}")
    return value


def _flag(raw: dict, key: str, path: Path, default: bool) -> bool:
    value = raw.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ConfigError(f"{WHERE}: {path}: {key} must be true or false, got {value!r}")
    return value


def expected_tensors(head: Eagle3Head, vocab_size: int) -> dict[str, tuple[tuple[int, ...], tuple[str, ...]]]:
    """Every tensor a head of this layout holds: name -> (shape, allowed safetensors dtypes); the
    optional ones (embed_tokens, d2t, t2d) included as `head` says it has them."""
    c, p = head.layer, head.layer_prefix
    h, joined = c.hidden_size, len(head.aux_layer_ids) * head.target_hidden_size
    q, kv, inter = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.intermediate_size
    f = FLOAT_DTYPES
    shapes = {
        "fc.weight": (h, joined),
        f"{p}self_attn.q_proj.weight": (q, 2 * h),
        f"{p}self_attn.k_proj.weight": (kv, 2 * h),
        f"{p}self_attn.v_proj.weight": (kv, 2 * h),
        f"{p}self_attn.o_proj.weight": (h, q),
        f"{p}mlp.gate_proj.weight": (inter, h),
        f"{p}mlp.up_proj.weight": (inter, h),
        f"{p}mlp.down_proj.weight": (h, inter),
        f"{p}hidden_norm.weight": (h,),
        f"{p}input_layernorm.weight": (h,),
        f"{p}post_attention_layernorm.weight": (h,),
        "norm.weight": (h,),
        "lm_head.weight": (head.draft_vocab_size, h),
    }
    if c.attention_bias:
        shapes |= {
            f"{p}self_attn.q_proj.bias": (q,),
            f"{p}self_attn.k_proj.bias": (kv,),
            f"{p}self_attn.v_proj.bias": (kv,),
            f"{p}self_attn.o_proj.bias": (h,),
        }
    if c.mlp_bias:
        shapes |= {f"{p}mlp.gate_proj.bias": (inter,), f"{p}mlp.up_proj.bias": (inter,), f"{p}mlp.down_proj.bias": (h,)}
    if head.norm_before_fc:
        shapes["input_norm.weight"] = (joined,)
    if head.own_embedding:
        shapes["embed_tokens.weight"] = (vocab_size, h)
    layout = {name: (shape, f) for name, shape in shapes.items()}
    if head.has_d2t:
        layout["d2t"] = ((head.draft_vocab_size,), INT_DTYPES)
    layout["t2d"] = ((vocab_size,), ("BOOL", "U8", *INT_DTYPES))  # optional: nothing reads it
    return layout


def _check_tensors(folder: Path, head: Eagle3Head, target: ModelConfig) -> Eagle3Head:
    """`head` with what its files hold (layer prefix, own embedding, d2t), each tensor checked."""
    try:
        files = weight_files(folder)
    except CheckpointError as e:
        raise ConfigError(f"{WHERE}: {e}") from None
    found: dict[str, tuple[Path, dict]] = {}
    for file in files:
        header, _ = read_header(file)
        for name, entry in header.items():
            if name != "__metadata__" and not name.endswith(IGNORED_SUFFIXES):
                found[name] = (file, entry)
    prefixes = [p for p in LAYER_PREFIXES if any(name.startswith(p) for name in found)]
    if len(prefixes) > 1:
        raise ConfigError(f"{WHERE}: {folder} holds both {prefixes[0]}* and {prefixes[1]}* tensors: one layer only")
    head = dataclasses.replace(
        head,
        layer_prefix=prefixes[0] if prefixes else LAYER_PREFIXES[0],
        own_embedding="embed_tokens.weight" in found,
        has_d2t="d2t" in found,
    )
    if head.layer.hidden_size != target.hidden_size and not head.own_embedding:
        raise ConfigError(
            f"{WHERE}: the head {folder} is {head.layer.hidden_size} wide and the target {target.hidden_size}: "
            "it cannot share the target's embedding, and it has no embed_tokens.weight of its own"
        )
    if head.draft_vocab_size != target.vocab_size and not head.has_d2t:
        raise ConfigError(
            f"{WHERE}: the head {folder} drafts over {head.draft_vocab_size} tokens (draft_vocab_size) of the "
            f"target's {target.vocab_size} and has no d2t tensor mapping them to the target's ids"
        )
    layout = expected_tensors(head, target.vocab_size)
    unexpected = sorted(set(found) - set(layout))
    if unexpected:
        raise ConfigError(f"{WHERE}: {folder} holds tensor(s) an EAGLE3 head does not: {unexpected[:5]}")
    missing = sorted(set(layout) - set(found) - {"t2d"})
    if missing:
        raise ConfigError(f"{WHERE}: {folder} lacks {len(missing)} tensor(s) of an EAGLE3 head, e.g. {missing[:3]}")
    for name, (file, entry) in found.items():
        shape, dtypes = layout[name]
        if tuple(entry.get("shape", ())) != shape:
            raise ConfigError(
                f"{WHERE}: {file}: tensor {name!r} has shape {list(entry.get('shape', ()))}, and the head's "
                f"config with the target's ({target.hidden_size} wide, {target.vocab_size} tokens, "
                f"{len(head.aux_layer_ids)} boundaries) implies {list(shape)}"
            )
        if entry.get("dtype") not in dtypes:
            raise ConfigError(f"{WHERE}: {file}: tensor {name!r} has dtype {entry.get('dtype')}, not one of {dtypes}")
    if head.has_d2t:
        _draft_to_target(folder, found["d2t"][0], head.draft_vocab_size, target.vocab_size)
    return head


def _draft_to_target(folder: Path, file: Path, draft_vocab: int, vocab: int) -> torch.Tensor:
    """The target id of each draft id (d2t holds the offsets), checked: inside the vocabulary, distinct."""
    from safetensors import safe_open

    with safe_open(file, framework="pt", device="cpu") as f:
        ids = torch.arange(draft_vocab) + f.get_tensor("d2t").long()
    if (ids < 0).any() or (ids >= vocab).any():
        raise ConfigError(f"{WHERE}: {folder}: d2t maps draft ids outside the target's {vocab} tokens")
    if ids.unique().numel() != draft_vocab:
        raise ConfigError(f"{WHERE}: {folder}: d2t maps two draft ids to one target id")
    return ids


# ---- the head -----------------------------------------------------------------------------------


class Eagle3Layer(nn.Module):
    """The head's decoder layer: Llama's, its attention reading the embedding and the hidden state side by side."""

    def __init__(self, c: ModelConfig):
        super().__init__()
        self.self_attn = LlamaAttention(c)
        self.self_attn.qkv_proj = FusedLinear(2 * c.hidden_size, self.self_attn.qkv_proj.shards, c.attention_bias)
        self.mlp = LlamaMLP(c)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)


class Eagle3Model(nn.Module):
    def __init__(self, head: Eagle3Head, vocab_size: int):
        super().__init__()
        c = head.layer
        joined = len(head.aux_layer_ids) * head.target_hidden_size
        self.head, self.vocab_size = head, vocab_size
        self.input_norm = RMSNorm(joined, c.rms_norm_eps) if head.norm_before_fc else None
        self.fc = nn.Linear(joined, c.hidden_size, bias=False)
        self.layer = Eagle3Layer(c)
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, head.draft_vocab_size, bias=False)
        self.embed_tokens = nn.Embedding(vocab_size, c.hidden_size) if head.own_embedding else None
        self.draft_to_target: torch.Tensor | None = None  # each draft id's target id, with d2t
        self.rotary: RotaryEmbedding | None = None
        self.ops: KernelOps = TORCH_OPS  # the target's, set by the proposer

    def combine(self, aux: torch.Tensor) -> torch.Tensor:
        """The target's joined boundary states `[n, joined]` as the head's hidden states `[n, H]`."""
        if self.input_norm is not None:
            aux = self.input_norm(aux, None, self.ops)[0]
        return self.fc(aux)

    def forward(self, embeds, hidden, positions, meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        """The normed outputs (the LM head's input) and the hidden states the next row reads."""
        ops, layer = self.ops, self.layer
        embeds = layer.input_layernorm(embeds, None, ops)[0]
        normed = layer.hidden_norm(hidden, None, ops)[0]
        residual = normed if self.head.norm_before_residual else hidden
        x = layer.self_attn(torch.cat([embeds, normed], dim=-1), self.rotary(positions, hidden.dtype), meta, ops)
        x, residual = layer.post_attention_layernorm(x, residual, ops)
        x = layer.mlp(x, ops)
        out, before_norm = self.norm(x, residual, ops)
        return out, out if self.head.norm_output else before_norm

    def compute_logits(self, out: torch.Tensor) -> torch.Tensor:
        """fp32 logits over the target's vocabulary: -inf for the tokens outside the draft vocabulary."""
        logits = self.lm_head(out).float()
        if self.draft_to_target is None:
            return logits
        full = logits.new_full((logits.shape[0], self.vocab_size), float("-inf"))
        full[:, self.draft_to_target] = logits
        return full


def load_head(folder: Path, head: Eagle3Head, vocab_size: int, dtype: torch.dtype, device: torch.device) -> Eagle3Model:
    """The head's weights from `folder` (checked by check_eagle3_folder), in `dtype` on `device`;
    CheckpointError for a tensor that is unreadable or holds NaN or inf."""
    from safetensors import SafetensorError, safe_open

    with torch.device("meta"):
        model = Eagle3Model(head, vocab_size)
    model.to_empty(device=device)
    model.to(dtype).requires_grad_(False)
    params = dict(model.named_parameters())
    # The head's decoder layer is `layer` here, under its checkpoint's prefix there (q/k/v and gate/up fused).
    layout = checkpoint_layout(model)
    for file in weight_files(folder):
        try:
            with safe_open(file, framework="pt", device="cpu") as f, torch.no_grad():
                for name in f.keys():
                    if name == "t2d" or name.endswith(IGNORED_SUFFIXES):
                        continue
                    tensor = f.get_tensor(name)
                    if name == "d2t":
                        ids = torch.arange(head.draft_vocab_size) + tensor.long()
                        model.draft_to_target = ids.to(device)
                        continue
                    if not tensor.isfinite().all():
                        raise CheckpointError(f"{file}: tensor {name!r} holds NaN or inf values (a corrupt checkpoint)")
                    prefix = head.layer_prefix
                    param, row, _ = layout["layer." + name[len(prefix) :] if name.startswith(prefix) else name]
                    target = params[param]
                    target[row : row + tensor.shape[0]].copy_(tensor.to(dtype))
        except SafetensorError as e:
            raise CheckpointError(f"{file}: not a readable safetensors file, truncated or corrupt ({e})") from e
    model.rotary = RotaryEmbedding(head.layer, device)
    return model.eval()


# ---- the proposer ---------------------------------------------------------------------------------


class _Pending:
    """One sequence's hidden states (after fc) that the head has not consumed, of positions start, start + 1, ..."""

    def __init__(self, start: int):
        self.start = self.end = start
        self.chunks: list[torch.Tensor] = []

    def cut(self, end: int) -> None:
        """Drop the rows of positions from `end` on."""
        keep, chunks = end - self.start, []
        for chunk in self.chunks:
            if keep <= 0:
                break
            chunks.append(chunk[:keep])
            keep -= chunk.shape[0]
        self.chunks, self.end = chunks, min(self.end, end)

    def add(self, rows: torch.Tensor) -> None:
        if rows.shape[0]:
            self.chunks.append(rows)
            self.end += rows.shape[0]

    def rows(self) -> torch.Tensor:
        return self.chunks[0] if len(self.chunks) == 1 else torch.cat(self.chunks)


class Eagle3Proposer:
    def __init__(
        self,
        folder: Path,
        head: Eagle3Head,
        runner,
        dtype: torch.dtype,
        device: torch.device,
        default_generator: torch.Generator,
    ):
        """`runner`: the target's ModelRunner, whose block size, pool size, op set, embedding (unless
        the head has its own) and step inputs the head uses."""
        self.runner, self.default_generator = runner, default_generator
        self.aux_layers = head.aux_layer_ids
        self.model = load_head(folder, head, runner.model.config.vocab_size, dtype, device)
        self.model.ops = runner.model.ops
        own = self.model.embed_tokens
        self.embed = own if own is not None else runner.model.model.embed_tokens
        c = head.layer
        # Its own tensors, laid out as one layer of the target's pool: the target's block ids index it.
        self.kv_cache = torch.zeros(
            2, 1, runner.num_blocks, runner.block_size, c.num_kv_heads, c.head_dim, dtype=dtype, device=device
        )
        attn = self.model.layer.self_attn
        attn.k_cache, attn.v_cache = self.kv_cache[0, 0], self.kv_cache[1, 0]
        self.pending: weakref.WeakKeyDictionary[Sequence, _Pending] = weakref.WeakKeyDictionary()

    def combine(self, aux: torch.Tensor) -> torch.Tensor:
        """The head's hidden states of the target's kept boundary states (fc applied)."""
        return self.model.combine(aux)

    def forward(self, step: StepInput, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One forward of the head over `step`'s rows: the logits of the wanted rows, and the hidden
        states there that the next draft's rows read."""
        out, hidden = self.model(
            self.embed(step.input_ids), hidden, step.positions, step.attention_metadata(with_window=False)
        )
        return self.model.compute_logits(out[step.logits_indices]), hidden[step.logits_indices]

    @torch.inference_mode()
    def observe(self, seqs: list[Sequence], starts: list[int], num_new_tokens: list[int], aux: torch.Tensor) -> None:
        """After a step's update: `aux` holds the target's boundary states of the step's tokens, each
        sequence's `num_new_tokens` rows from position `starts[i]` on; keep those of the positions the
        target kept (a finished sequence's go)."""
        hidden = self.combine(aux)
        row = 0
        for seq, start, n in zip(seqs, starts, num_new_tokens):
            rows, row = hidden[row : row + n], row + n
            if seq.is_finished:
                self.pending.pop(seq, None)
                continue
            kept = rows[: max(0, seq.num_computed_tokens - start)]
            state = self.pending.get(seq)
            if state is None or state.start != seq.draft_num_computed or not state.start <= start <= state.end:
                # New, or preempted (the scheduler reset draft_num_computed), or its K/V computed
                # elsewhere: the head starts at this step's first position.
                state = self.pending[seq] = _Pending(start)
                seq.draft_num_computed = start
            state.cut(start)  # rows of drafts the last step rejected
            state.add(kept)

    @torch.inference_mode()
    def propose(
        self, seqs: list[Sequence], counts: list[int], block_tables: np.ndarray
    ) -> list[tuple[list[int], torch.Tensor | None]]:
        """Up to counts[i] drafts for each sequence whose unconsumed hidden states reach its computed
        tokens (none for the others), and the distribution each sampled draft came from."""
        ready = []
        for i, seq in enumerate(seqs):
            state = self.pending.get(seq)
            if state is not None and state.start == seq.draft_num_computed < seq.num_computed_tokens <= state.end:
                ready.append(i)
        drafts: list[list[int]] = [[] for _ in seqs]
        probs: list[list[torch.Tensor]] = [[] for _ in seqs]
        if not ready:
            return [([], None) for _ in seqs]
        # First forward: the positions each has not consumed; row p reads the token at p + 1.
        starts = [seqs[i].draft_num_computed for i in ready]
        tokens = [seqs[i].token_slice(a + 1, seqs[i].num_computed_tokens + 1) for i, a in zip(ready, starts)]
        hidden_parts = []
        for i in ready:
            seq = seqs[i]
            state = self.pending[seq]
            state.cut(seq.num_computed_tokens)
            hidden_parts.append(state.rows())
            self.pending[seq] = _Pending(seq.num_computed_tokens)
            seq.draft_num_computed = seq.num_computed_tokens
        hidden = hidden_parts[0] if len(hidden_parts) == 1 else torch.cat(hidden_parts)
        active = ready
        while active:
            step = self.runner.prepare_tokens(
                [seqs[i] for i in active], tokens, starts, [1] * len(active), block_tables
            )
            logits, hidden = self.forward(step, hidden)
            rows = [row for row, i in enumerate(active) if not seqs[i].params.greedy]
            q = {row: sampling_probs(logits[row], *sampling_settings(seqs[active[row]])) for row in rows}
            argmax, *q_host = to_host(logits.argmax(dim=-1), *q.values())  # one host read a forward
            generators = [seqs[active[row]].generator or self.default_generator for row in rows]
            drawn = dict(zip(rows, draw(q_host, generators)))
            still, next_tokens, next_starts, keep = [], [], [], []
            for row, i in enumerate(active):
                token = drawn[row] if row in q else int(argmax[row])
                drafts[i].append(token)
                if row in q:  # greedy drafts carry none: the verifier compares them with the target's argmax
                    probs[i].append(q[row])
                if len(drafts[i]) < counts[i]:
                    still.append(i)
                    next_tokens.append([token])
                    next_starts.append(starts[row] + len(tokens[row]))  # the position after this row's last
                    keep.append(row)
            if len(keep) < len(active):
                hidden = _take_rows(hidden, keep)
            active, tokens, starts = still, next_tokens, next_starts
        return [(d, torch.stack(p) if p else None) for d, p in zip(drafts, probs)]


def _take_rows(tensor: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """`tensor[rows]`, the index sent through pinned memory without waiting for the device."""
    index = torch.tensor(rows, dtype=torch.int64)
    if tensor.device.type != "cpu":
        index = index.pin_memory().to(tensor.device, non_blocking=True)
    return tensor.index_select(0, index)
