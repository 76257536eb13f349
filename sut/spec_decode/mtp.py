"""DeepSeek-V3/R1's multi-token-prediction (MTP) module as proposer. The module
(sut/model/deepseek_mtp.py: eh_proj over the embedding of token p + 1 and the target's hidden state
of p, one decoder layer, shared_head.norm, the target's LM head) is the runner's, on every
tensor-parallel rank (`ModelRunner.execute_draft`); this file checks its tensors before any model
loads and drafts with it.

h_p is the target's hidden state of position p after its final norm (what the target's LM head
reads: transformers' `hidden_states[-1]`, TensorRT-LLM's and vLLM's model output). The module's own
output after `shared_head.norm` is both what the LM head reads for its draft and, chained, the
hidden state of the next row (TensorRT-LLM's "MTP Eagle", as the MLPerf DeepSeek-R1 submissions run
it with 3 drafts; transformers' MtpModel passes the same from one MTP layer to the next). vLLM feeds
back the output before that norm instead, and zeroes the embedding at position 0: neither is done here.

The bookkeeping is the EAGLE3 head's (sut/spec_decode/eagle3.py), which this proposer inherits: row p
of the module reads (token p + 1, h_p) at position p and predicts the token at p + 2; a proposal
first runs the module over the positions it has not consumed (the verified tokens of the last step,
or the whole prompt), which gives draft 1, then once per draft on its own output. The target's
hidden states arrive through `observe` after each step: the step returns the residual stream leaving
its last layer (the boundary `num_hidden_layers` of `aux_layers`), and the final norm is applied here;
each sequence keeps the rows of the positions the target kept, so a rejected draft's row is dropped
and its K/V in the module's cache is overwritten before anything reads it. The module has its own
one-layer latent KV cache (576 values a token for DeepSeek-V3) of the target's pool size, indexed by
the target's block tables and slot mapping. Drafts are greedy or sampled with the request's settings
from the module's distribution, which the verifier receives, so rejection sampling stays exact."""

import dataclasses
import json
import weakref
from pathlib import Path

import torch

from kernels.fp8 import FP8_BLOCK
from sut.config import ModelConfig
from sut.errors import CheckpointError, ConfigError
from sut.model.deepseek_mtp import SCALE_SUFFIX, SHARED_COPIES, DeepseekV3MTPLayer, mtp_prefix, mtp_tensors
from sut.model.loader import checkpoint_layout
from sut.spec_decode.eagle3 import Eagle3Proposer

WHERE = "engine setting speculative_config (method 'mtp')"
ARCHITECTURE = "DeepseekV3ForCausalLM"
FLOAT_DTYPES = ("F32", "F16", "BF16")
FP8_DTYPE = "F8_E4M3"


# ---- the module in the target's checkpoint, checked before any model loads ---------------------------


def check_mtp_module(folder: Path, target: ModelConfig) -> ModelConfig:
    """For method 'mtp': check that the target at `folder` is a DeepSeek-V3 model whose checkpoint
    holds the MTP module, every tensor by name, shape and dtype (reading only headers); return the
    config the KV pool's sizing counts for the module's cache (one layer of the target's).
    ConfigError naming what does not fit."""
    if target.architecture != ARCHITECTURE:
        raise ConfigError(
            f"{WHERE}: the MTP module is DeepSeek-V3/R1's ({ARCHITECTURE}); the target {folder} is a "
            f"{target.architecture}, which has none: use method 'ngram', 'draft_model' or 'eagle3'"
        )
    prefix = mtp_prefix(target)
    try:
        found = mtp_tensors(folder, prefix)
    except CheckpointError as e:
        raise ConfigError(f"{WHERE}: {e}") from None
    if not found:
        declared = json.loads((folder / "config.json").read_text()).get("num_nextn_predict_layers")
        raise ConfigError(
            f"{WHERE}: the target checkpoint {folder} holds no MTP module: no {prefix}* tensors (the layer after "
            f"its {target.num_layers}; config.json num_nextn_predict_layers={declared}), so it cannot draft for itself"
        )
    with torch.device("meta"):
        layer = DeepseekV3MTPLayer(target)
    layout = checkpoint_layout(layer)
    expected = {name: (shape, FLOAT_DTYPES) for name, (_, _, shape) in layout.items()}
    for name in SHARED_COPIES:
        expected[name] = (torch.Size([target.vocab_size, target.hidden_size]), FLOAT_DTYPES)
    for name, (_, entry) in found.items():  # FP8 weights and their block scales
        weight = name.removesuffix(SCALE_SUFFIX)
        if name.endswith(SCALE_SUFFIX) and weight in layout and len(layout[weight][2]) == 2:
            shape = layout[weight][2]
            expected[name] = (torch.Size([-(-d // FP8_BLOCK) for d in shape]), ("F32", "BF16"))
            expected[weight] = (shape, (FP8_DTYPE,))
    unexpected = sorted(set(found) - set(expected))
    if unexpected:
        raise ConfigError(
            f"{WHERE}: {folder} holds tensor(s) the MTP module does not: {[prefix + n for n in unexpected[:5]]}"
        )
    missing = sorted(set(layout) - set(found))
    if missing:
        raise ConfigError(
            f"{WHERE}: the MTP module in {folder} lacks {len(missing)} tensor(s), "
            f"e.g. {[prefix + n for n in missing[:3]]}"
        )
    orphans = sorted(n for n, (_, e) in found.items() if e.get("dtype") == FP8_DTYPE and n + SCALE_SUFFIX not in found)
    if orphans:
        raise ConfigError(f"{WHERE}: {folder}: FP8 tensor {prefix + orphans[0]!r} has no {SCALE_SUFFIX} beside it")
    for name, (file, entry) in found.items():
        shape, dtypes = expected[name]
        if list(entry.get("shape", ())) != list(shape):
            raise ConfigError(
                f"{WHERE}: {file}: tensor {prefix + name!r} has shape {entry.get('shape')}, and the target's "
                f"config.json implies {list(shape)}"
            )
        if entry.get("dtype") not in dtypes:
            raise ConfigError(
                f"{WHERE}: {file}: tensor {prefix + name!r} has dtype {entry.get('dtype')}, not one of {list(dtypes)}"
            )
    return dataclasses.replace(target, num_layers=1)


# ---- the proposer ------------------------------------------------------------------------------------


class MtpProposer(Eagle3Proposer):
    """EAGLE3's proposer (observe, propose: the pending hidden states, the chained drafts) over the
    target's own MTP module, which the target's runner holds and runs on every rank."""

    def __init__(self, runner, default_generator: torch.Generator):
        """`runner`: the target's ModelRunner, holding the module (`mtp`) and its latent cache
        (`mtp_kv_cache`), whose final norm, block size and step inputs the module uses.
        Eagle3Proposer.__init__ loads a head folder: not called."""
        self.runner, self.default_generator = runner, default_generator
        # What leaves the target's last layer, before its final norm.
        self.aux_layers = (runner.model.config.num_layers,)
        self.pending = weakref.WeakKeyDictionary()

    def combine(self, aux: torch.Tensor) -> torch.Tensor:
        """What leaves the target's last layer `[n, H]`, through its final norm: h_p."""
        target = self.runner.model
        return target.model.norm(aux, None, target.ops)[0]

    def forward(self, step, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One forward of the module on every rank: the logits of the wanted rows and its output
        there, which is, chained, the next row's hidden state."""
        return self.runner.execute_draft(step, hidden)
