"""One settings check: the engine's typed settings (sut/config/engine.py checks each one's type and
range and what settings ask of each other) resolved against the model folder and this machine,
every cross-check in one place, before any process starts or any weight loads. What it returns is
what the engine, its tensor-parallel ranks and its data-parallel replicas are built from."""

import dataclasses
import os
from pathlib import Path

import torch

from sut.config import DTYPES, EngineConfig, ModelConfig
from sut.config.resolved import DraftModel, ResolvedConfig
from sut.errors import CheckpointError, ConfigError
from sut.model.checksums import verify_folder
from sut.parallel import check_divides, check_fp8_blocks, torchrun_group
from sut.spec_decode.draft_model import check_draft_folder
from sut.spec_decode.eagle3 import check_eagle3_folder
from sut.spec_decode.mtp import check_mtp_module


def resolve(model_path: str | Path, config: EngineConfig) -> ResolvedConfig:
    """`config` against the model at `model_path` and this machine's devices: ConfigError or
    CheckpointError naming what does not fit. Verifies the folders' checksums where asked."""
    folder = Path(model_path).expanduser()
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: model folder does not exist")
    mc = ModelConfig.from_folder(folder)
    max_model_len = config.max_model_len or mc.max_position_embeddings
    if max_model_len > mc.max_position_embeddings:
        raise ConfigError(
            f"engine setting max_model_len={max_model_len} exceeds the model's "
            f"max_position_embeddings={mc.max_position_embeddings}"
        )
    whole_prompts = config.static_batching or not config.enable_chunked_prefill
    if whole_prompts and max_model_len > config.max_num_batched_tokens:
        raise ConfigError(
            f"without chunked prefill every sequence must fit one step: max_model_len "
            f"{max_model_len} exceeds max_num_batched_tokens "
            f"{config.max_num_batched_tokens}; lower the one or raise the other"
        )
    device = config.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = mc.dtype if config.dtype == "auto" else DTYPES[config.dtype]
    draft = None
    spec = config.speculative_config
    if spec is not None:
        spec.check_fits(max_model_len, config.max_num_batched_tokens)
        if spec.method == "draft_model":  # checked before either model loads
            draft_folder = Path(spec.model).expanduser()
            draft_config = check_draft_folder(draft_folder, folder, mc)
            if draft_config.max_position_embeddings < max_model_len:
                raise ConfigError(
                    f"engine setting speculative_config.model: the draft {draft_folder} has "
                    f"max_position_embeddings={draft_config.max_position_embeddings}, under the "
                    f"target's max_model_len={max_model_len}"
                )
            weight_bytes = sum(f.stat().st_size for f in draft_folder.glob("*.safetensors"))
            draft = DraftModel(draft_folder, draft_config, weight_bytes)
        elif spec.method == "mtp":  # the target's own module, checked before any model loads
            _check_head_settings(config, spec.method)
            # Its weights load before the KV pool is sized (sut/worker/model_runner.py): the memory free counts them.
            draft = DraftModel(folder, check_mtp_module(folder, mc), 0)
        elif spec.method == "eagle3":  # checked before any model loads
            _check_head_settings(config, spec.method)
            head_folder = Path(spec.model).expanduser()
            head = check_eagle3_folder(head_folder, mc, max_model_len)
            weight_bytes = sum(f.stat().st_size for f in head_folder.glob("*.safetensors"))
            draft = DraftModel(head_folder, head.layer, weight_bytes, eagle3=head)
    _check_parallel(config, mc, device)
    _check_model_features(config, mc)
    if config.verify_checksums:
        verify_folder(folder)
        if draft is not None and draft.folder != folder:  # an MTP module is the target's
            verify_folder(draft.folder)
    return ResolvedConfig(folder, config, mc, max_model_len, dtype, device, draft)


def _check_head_settings(config: EngineConfig, method: str) -> None:
    """What a head that reads the target's hidden states (EAGLE3, MTP) does not run with yet."""
    refused = {
        # An EAGLE3 head would share a rank's embedding slice (DeepSeek's MTP module runs on every rank).
        "tensor_parallel_size > 1": config.tensor_parallel_size > 1 and method == "eagle3",
        "cuda_graphs": config.cuda_graphs,  # a captured step does not keep the hidden states the head reads
        "enable_prefix_caching": config.enable_prefix_caching,  # a cached prefix has no hidden states
        "disaggregation": config.disaggregation is not None,  # the prompt's hidden states stay on the prefill side
    }
    for setting, on in refused.items():
        if on:
            raise ConfigError(
                f"engine settings speculative_config method {method!r} and {setting} do not go together yet"
            )


def _check_parallel(config: EngineConfig, mc: ModelConfig, device: str) -> None:
    """Tensor and data parallelism against the model's shape and the devices this process sees."""
    tp, dp = config.tensor_parallel_size, config.data_parallel_size
    if config.disaggregation is not None:  # its workers are replicas of a kind: each its own GPU or cores
        dp = config.disaggregation.num_workers
        what = f"disaggregation={config.disaggregation.prefill} prefill + {config.disaggregation.decode} decode workers"
    else:
        what = f"data_parallel_size={dp}"
    if tp > 1:
        check_divides(mc, tp)
        check_fp8_blocks(mc, tp)  # a rank's slices of FP8 weights are whole scale blocks
        if config.cuda_graphs:
            raise ConfigError("engine settings cuda_graphs and tensor_parallel_size > 1 do not go together yet")
    group = torchrun_group()
    if group is not None:  # the ranks torchrun started (sut/worker/torchrun_entry.py), on this node and others
        if tp != group.size or dp > 1:
            raise ConfigError(
                f"engine settings tensor_parallel_size={tp} and {what}: under torchrun an engine's tensor-parallel "
                f"ranks are the {group.size} processes torchrun started (WORLD_SIZE): set tensor_parallel_size="
                f"{group.size}, one replica, no disaggregation"
            )
        if device.startswith("cuda") and torch.cuda.device_count() < group.local_size:
            raise ConfigError(
                f"torchrun started {group.local_size} ranks on this node (LOCAL_WORLD_SIZE), one a GPU, and "
                f"{torch.cuda.device_count()} are visible"
            )
        return
    if dp > 1 and device.startswith("cuda:"):
        raise ConfigError(f"engine setting device={device!r} names one GPU, and {what} gives each its own: use 'cuda'")
    if device.startswith("cuda"):
        visible = torch.cuda.device_count()
        if dp > 1 and visible < dp * tp:
            raise ConfigError(
                f"engine settings {what} x tensor_parallel_size={tp} need {dp * tp} GPUs, and {visible} are visible"
            )
        if dp == 1 and visible < tp:
            raise ConfigError(f"engine setting tensor_parallel_size={tp} needs {tp} GPUs, and {visible} are visible")
    elif dp > 1:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        if cores < dp:
            raise ConfigError(f"engine setting {what} needs {dp} cores, and this process has {cores}")


def _check_model_features(config: EngineConfig, mc: ModelConfig) -> None:
    """What the engine does not do yet for a model's kind of layers (gpt-oss's)."""
    tp = config.tensor_parallel_size
    if mc.moe is not None and mc.mla is None and tp > 1:  # DeepSeek-V3's experts split across the ranks
        raise ConfigError(
            f"engine setting tensor_parallel_size={config.tensor_parallel_size}: a mixture-of-experts model "
            f"({mc.architecture}) runs one replica per GPU here (data_parallel_size), not split across GPUs"
        )
    if mc.sliding_window is not None and config.enable_prefix_caching:
        raise ConfigError(
            f"engine setting enable_prefix_caching: not for a model with sliding-window layers ({mc.architecture}) yet"
        )
    if mc.sliding_window is not None and config.disaggregation is not None:
        raise ConfigError(
            f"engine setting disaggregation: not for a model with sliding-window layers ({mc.architecture}) yet: "
            "the transfer carries one block table"
        )


def for_replica(resolved: ResolvedConfig) -> ResolvedConfig:
    """What one data-parallel replica is built from: one engine, its folders already verified."""
    engine = dataclasses.replace(resolved.engine, data_parallel_size=1, verify_checksums=False)
    return dataclasses.replace(resolved, engine=engine)


def for_role(resolved: ResolvedConfig, role: str) -> ResolvedConfig:
    """What a disaggregated worker is built from: one engine, its folders already verified; a
    prefill worker without the speculation only decodes use (nor the draft model's weights)."""
    engine = dataclasses.replace(resolved.engine, disaggregation=None, verify_checksums=False)
    if role == "decode":
        return dataclasses.replace(resolved, engine=engine)
    engine = dataclasses.replace(engine, speculative_config=None)
    return dataclasses.replace(resolved, engine=engine, draft=None)
