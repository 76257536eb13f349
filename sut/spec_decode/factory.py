"""The proposer the engine's settings name (`speculative_config.method`): n-gram lookup, a draft
model, an EAGLE3 head or DeepSeek's MTP module; none without speculation."""

import torch

from sut.config.resolved import ResolvedConfig
from sut.spec_decode.draft_model import DraftModelProposer
from sut.spec_decode.eagle3 import Eagle3Proposer
from sut.spec_decode.mtp import MtpProposer
from sut.spec_decode.ngram import NgramProposer
from sut.spec_decode.proposer import Proposer
from sut.worker.model_runner import ModelRunner


def make_proposer(
    resolved: ResolvedConfig, runner: ModelRunner, device: torch.device, default_generator: torch.Generator
) -> Proposer | None:
    """The proposer of `resolved`'s settings, drafting for the target that `runner` runs on `device`
    (an EAGLE3 head reads its op set, embedding and KV pool's shape; the MTP module is the runner's
    own; a draft model's cache takes as many blocks). None when the engine does not speculate."""
    spec, draft = resolved.engine.speculative_config, resolved.draft
    if spec is None:
        return None
    if spec.method == "ngram":
        return NgramProposer(spec.prompt_lookup_min, spec.prompt_lookup_max)
    if spec.method == "eagle3":
        return Eagle3Proposer(draft.folder, draft.eagle3, runner, resolved.dtype, device, default_generator)
    if spec.method == "mtp":  # the target's own module, which its runner holds
        return MtpProposer(runner, default_generator)
    return DraftModelProposer(
        draft.folder,
        draft.config,
        resolved.engine,
        resolved.max_model_len,
        resolved.dtype,
        device,
        runner.num_blocks,
        default_generator,
    )
