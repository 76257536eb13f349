"""Load a checkpoint from a local Hugging Face folder (single or sharded safetensors) into the model
class sut/model/registry.py names for its architecture.

The model is built on the meta device and each tensor is read and put in place one at a time,
so peak memory is about one copy of the weights. Every problem with the files is a
CheckpointError naming the file and what is wrong with it.
"""

import json
from pathlib import Path

import torch
from torch import nn

from kernels.fp8 import FP8_BLOCK, dequantize_fp8, quantize_fp8_block
from kernels.mxfp4 import dequantize_mxfp4
from sut.config import ModelConfig
from sut.errors import CheckpointError
from sut.model.fp8 import Fp8Linear, keep_checkpoint_fp8, quantize_linears
from sut.model.registry import model_class
from sut.parallel import Shard, local_config, read_shard, slice_for, split_of

IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)  # buffers some old checkpoints carry
# gpt-oss's experts, stored as MXFP4 (`<name>_blocks`, `<name>_scales`) in its checkpoints.
MXFP4_WEIGHTS = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")
MXFP4_PARTS = tuple(f"{w}_{part}" for w in MXFP4_WEIGHTS for part in ("blocks", "scales"))


def weight_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise CheckpointError(f"{index}: not a valid safetensors index ({e!r})") from e
        files = [folder / name for name in sorted(set(weight_map.values()))]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise CheckpointError(f"{index} names shard(s) that are missing: {missing}")
        return files
    # Only the folder's own files: what else a backend keeps beside the checkpoint lives in subfolders.
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{folder}: no *.safetensors checkpoint in the model folder")
    return files


def tensor_names(folder: Path, files: list[Path]) -> dict[Path, list[str]]:
    """Each file's tensor names. A tensor in two files means one of them is not a shard of this
    checkpoint: refused by name, before either is read."""
    from safetensors import SafetensorError, safe_open  # here: sut imports with torch and numpy alone (gpu_check)

    names_in, seen = {}, {}
    for file in files:
        try:
            with safe_open(file, framework="pt", device="cpu") as f:
                names_in[file] = list(f.keys())
        except SafetensorError as e:
            raise CheckpointError(f"{file}: not a readable safetensors file, truncated or corrupt ({e})") from e
        for name in names_in[file]:
            if name in seen:
                raise CheckpointError(
                    f"{folder}: tensor {name!r} is in both {seen[name].name} and {file.name}, so one of them is not "
                    "a shard of the checkpoint: remove it, or convert the folder again if an older converter wrote "
                    "it (`make models` for the demo model)"
                )
            seen[name] = file
    return names_in


def checkpoint_layout(model: nn.Module, rank: Shard | None = None) -> dict[str, tuple[str | None, int, torch.Size]]:
    """Each checkpoint tensor name -> (model parameter, first row in it, shape in the checkpoint).
    A fused layer's parameter (a module with `shards`) takes its shards' tensors as row blocks, in
    order, and an FP8 one's block scales likewise, a scale row to each `block` rows; a tensor of
    fewer dimensions than its parameter fills rows of the parameter with its leading dimensions
    flattened (DeepSeek's per-expert linears in stacked experts). A tensor that tensor-parallel rank
    `rank` does not hold at all (another rank's expert) maps to parameter None: checked present,
    never read."""
    layout = {}
    for module_name, module in model.named_modules():
        if hasattr(module, "checkpoint_layout"):  # a module whose checkpoint tensors are not its parameters
            layout.update(module.checkpoint_layout(module_name, rank))
            continue
        for leaf, param in module.named_parameters(recurse=False):
            shards = getattr(module, "shards", None)
            if shards is None:
                layout[f"{module_name}.{leaf}"] = (f"{module_name}.{leaf}", 0, param.shape)
                continue
            per = module.block if leaf == "weight_scale_inv" else 1  # weight rows a row of the parameter covers
            parent, row = module_name.rpartition(".")[0], 0
            for shard, rows in shards.items():
                layout[f"{parent}.{shard}.{leaf}"] = (
                    f"{module_name}.{leaf}",
                    row // per,
                    torch.Size([-(-rows // per), *param.shape[1:]]),
                )
                row += rows
    return layout


def load_model(
    folder: str | Path,
    config: ModelConfig,
    dtype: torch.dtype,
    device: torch.device,
    shard: Shard | None = None,
    keep_mxfp4: bool | None = None,
    quantization: str | None = None,
    keep_fp8: bool | None = None,
) -> nn.Module:
    """`shard`: a tensor-parallel rank's part (sut/parallel/), of which alone it reads the
    checkpoint's slices. `keep_mxfp4`: hold an MXFP4 checkpoint's experts as they are stored (by
    default on CUDA, whose MoE kernel decodes them) rather than dequantized to `dtype`.
    `quantization`: the engine's setting; "fp8" quantizes the decoder's linears once loaded.
    `keep_fp8`: hold an FP8 checkpoint's block-scaled weights as they are stored (by default on
    CUDA, whose FP8 GEMM and MoE kernel scale them as they go): each such linear an Fp8Linear, the
    experts FP8 (sut/model/fp8.py's keep_checkpoint_fp8), rather than dequantized to `dtype`."""
    from safetensors import SafetensorError, safe_open

    folder = Path(folder)
    if shard is not None:
        config = local_config(config, shard.size)
    with torch.device("meta"):
        model = model_class(config)(config)
    if keep_mxfp4 is None:
        keep_mxfp4 = device.type == "cuda"
    mxfp4 = config.quantization == "mxfp4"
    if mxfp4 and keep_mxfp4:
        with torch.device("meta"):
            model.keep_experts_mxfp4()
    names_in = tensor_names(folder, weight_files(folder))
    # FP8 weights (DeepSeek's): each `<linear>.weight` beside its `.weight_scale_inv`, kept or dequantized.
    fp8 = _fp8_weights(names_in) if config.quantization == "fp8" else {}
    if keep_fp8 is None:
        keep_fp8 = device.type == "cuda"
    if fp8 and keep_fp8:
        with torch.device("meta"):
            keep_checkpoint_fp8(model, set(fp8), dtype)
    expected = checkpoint_layout(model, shard)
    if config.tie_word_embeddings:
        del expected["lm_head.weight"]
    quantized = _mxfp4_layout(expected, folder) if mxfp4 and not keep_mxfp4 else {}
    loaded: set[str] = set()
    for file, names in names_in.items():
        try:
            for name in names:
                if name.endswith(IGNORED_SUFFIXES) or (config.tie_word_embeddings and name == "lm_head.weight"):
                    continue
                if _is_next_token_layer(name, config):  # DeepSeek's MTP module: the MTP proposer loads it
                    continue
                weight_name = name.removesuffix("_scale_inv")
                if weight_name in fp8:  # one half of an FP8 pair; with both, the pair or the dequantized weight goes in
                    loaded |= _put_fp8(model, expected, fp8, file, name, weight_name, shard, device, dtype, config)
                    continue
                if name not in expected:
                    raise CheckpointError(f"{file}: unexpected tensor {name!r} for a {config.architecture} model")
                param_name, row, shape = expected[name]
                if param_name is None:  # another tensor-parallel rank's (its expert): not read here
                    loaded.add(name)
                    continue
                # One tensor per opening: the file's pages are mapped only while their tensor is
                # copied, so peak memory stays about one copy of the weights.
                with safe_open(file, framework="pt", device="cpu") as f:
                    tensor = read_shard(f, name, shard)
                if tensor.shape != shape:
                    what = f"its tensor-parallel slice {shard.rank}/{shard.size}" if shard else "it"
                    raise CheckpointError(
                        f"{file}: tensor {name!r} has shape {tuple(tensor.shape)} ({what}), "
                        f"config.json implies {tuple(shape)}"
                    )
                if name.endswith(MXFP4_PARTS) and tensor.dtype != torch.uint8:
                    raise CheckpointError(f"{file}: MXFP4 tensor {name!r} has dtype {tensor.dtype}, not uint8")
                if param_name in quantized:
                    _put_mxfp4(model, param_name, quantized[param_name], name, tensor, device, dtype)
                elif name.endswith(MXFP4_PARTS):
                    _put(model, param_name, row, tensor, device, torch.uint8)
                elif not tensor.is_floating_point():
                    raise CheckpointError(f"{file}: tensor {name!r} has dtype {tensor.dtype}, not a floating-point one")
                elif not tensor.isfinite().all():  # every output would be garbage
                    raise CheckpointError(f"{file}: tensor {name!r} holds NaN or inf values (a corrupt checkpoint)")
                else:
                    _put(model, param_name, row, tensor, device, dtype)
                loaded.add(name)
                del tensor
        except SafetensorError as e:
            raise CheckpointError(f"{file}: not a readable safetensors file, truncated or corrupt ({e})") from e
    missing = sorted(set(expected) - loaded)
    if missing:
        raise CheckpointError(f"{folder}: checkpoint lacks {len(missing)} tensor(s), e.g. {missing[:3]}")
    if quantization == "fp8":  # the engine's setting: the decoder's linears to FP8 (sut/model/fp8.py)
        quantize_linears(model, device, dtype)
    model.finish_loading(device, shard)
    return model.eval()


def _fp8_weights(names_in: dict[Path, list[str]]) -> dict[str, dict]:
    """{checkpoint weight name: {}} of each weight stored in FP8, known by its `weight_scale_inv`."""
    names = {n for ns in names_in.values() for n in ns}
    return {n.removesuffix("_scale_inv"): {} for n in names if n.endswith(".weight_scale_inv")}


def _put_fp8(model, expected, fp8, file, name, weight_name, shard, device, dtype, config) -> set[str]:
    """Keep one half of an FP8 weight's pair (e4m3 `[out, in]`, fp32 scales per 128 x 128 block; of
    each, tensor-parallel rank `shard`'s slice); with both, check them and put in place the pair as
    stored, where the model holds this weight in FP8 (its scales are expected too), else the
    dequantized weight. Returns the checkpoint names this put in place (or skipped: another rank's)."""
    from safetensors import safe_open

    if weight_name not in expected:
        raise CheckpointError(f"{file}: unexpected tensor {name!r} for a {config.architecture} model")
    param_name, row, shape = expected[weight_name]
    if param_name is None:  # another tensor-parallel rank's (its expert): not read here
        return {name}
    # A rank's slice reads its own rows or columns of the scales: whole blocks only (check_fp8_blocks).
    split = split_of(weight_name) if shard is not None and shard.size > 1 else None
    dim = {"rows": 0, "columns": 1}.get(split)
    if dim is not None and shape[dim] % FP8_BLOCK:
        raise CheckpointError(
            f"{file}: FP8 tensor {weight_name!r}: tensor-parallel rank {shard.rank}/{shard.size}'s slice has "
            f"{shape[dim]} {split}, not a multiple of its {FP8_BLOCK}x{FP8_BLOCK} scale blocks (engine setting "
            "tensor_parallel_size)"
        )
    with safe_open(file, framework="pt", device="cpu") as f:
        fp8[weight_name]["scale" if name.endswith("_scale_inv") else "weight"] = read_shard(f, name, shard)
    pair = fp8[weight_name]
    if len(pair) < 2:
        return set()
    weight, scale = pair.pop("weight"), pair.pop("scale")
    grid = [-(-d // FP8_BLOCK) for d in shape]
    if weight.dtype != torch.float8_e4m3fn:
        raise CheckpointError(f"{file}: FP8 tensor {weight_name!r} has dtype {weight.dtype}, not float8_e4m3fn")
    if weight.shape != shape:
        what = f"its tensor-parallel slice {shard.rank}/{shard.size}" if shard else "it"
        raise CheckpointError(
            f"{file}: tensor {weight_name!r} has shape {tuple(weight.shape)} ({what}), config.json implies "
            f"{tuple(shape)}"
        )
    if list(scale.shape) != grid or not scale.is_floating_point():
        raise CheckpointError(
            f"{file}: tensor {weight_name + '_scale_inv'!r} must be floating point of shape {grid} (one scale per "
            f"{FP8_BLOCK}x{FP8_BLOCK} block of {list(shape)}), got {scale.dtype} {list(scale.shape)}"
        )
    scale_name = weight_name + "_scale_inv"
    if scale_name in expected:  # held as stored: e4m3 weights, fp32 scales, whatever the model's dtype
        # e4m3fn has no inf; its NaNs are the bytes x1111111. Checked as bytes: no float copy of the weight.
        if not scale.isfinite().all() or ((weight.view(torch.uint8) & 0x7F) == 0x7F).any():
            raise CheckpointError(f"{file}: FP8 tensor {weight_name!r} or its scales hold NaN or inf values")
        _put(model, param_name, row, weight, device, weight.dtype)
        scale_param, scale_row, _ = expected[scale_name]
        _put(model, scale_param, scale_row, scale.float(), device, torch.float32)
        return {weight_name, scale_name}
    dense = dequantize_fp8(weight, scale.float(), FP8_BLOCK)
    if not dense.isfinite().all():
        raise CheckpointError(
            f"{file}: FP8 tensor {weight_name!r} dequantizes to NaN or inf values (a corrupt checkpoint)"
        )
    _put(model, param_name, row, dense, device, dtype)
    return {weight_name}


def _is_next_token_layer(name: str, config: ModelConfig) -> bool:
    """A DeepSeek checkpoint's multi-token-prediction module, stored as the layers after the last."""
    if config.mla is None or not name.startswith("model.layers."):
        return False
    index = name.split(".")[2]
    return index.isdigit() and int(index) >= config.num_layers


def _mxfp4_layout(expected: dict, folder: Path) -> dict[str, dict]:
    """Replace each MXFP4 expert weight `[experts, in, out]` in `expected` by its checkpoint pair:
    `_blocks [experts, out, in / 32, 16]` (uint8, two e2m1 values a byte) and `_scales [experts, out,
    in / 32]` (uint8 E8M0); return {parameter: {}}, where the loader keeps a pair until both are read."""
    quantized = {}
    for name in [n for n in expected if n.endswith(MXFP4_WEIGHTS)]:
        param_name, _, (experts, rows_in, rows_out) = expected.pop(name)
        if rows_in % 32:
            raise CheckpointError(f"{folder}: {name} has {rows_in} input features, not a multiple of MXFP4's 32")
        expected[name + "_blocks"] = (param_name, 0, torch.Size([experts, rows_out, rows_in // 32, 16]))
        expected[name + "_scales"] = (param_name, 0, torch.Size([experts, rows_out, rows_in // 32]))
        quantized[param_name] = {}
    return quantized


def _put_mxfp4(model: nn.Module, param_name: str, pair: dict, name: str, tensor: torch.Tensor, device, dtype) -> None:
    """Keep one half of an MXFP4 pair; with both, put the dequantized weight in place (this backend
    computes the experts from dense weights)."""
    pair[name.rpartition("_")[2]] = tensor
    if len(pair) == 2:
        dense = dequantize_mxfp4(pair.pop("blocks"), pair.pop("scales"), torch.float32).transpose(1, 2)
        _put(model, param_name, 0, dense, device, dtype)


def _put(model: nn.Module, param_name: str, row: int, tensor: torch.Tensor, device, dtype) -> None:
    """Copy `tensor` into the rows from `row` on of parameter `param_name`, allocating it on first use."""
    module_name, _, leaf = param_name.rpartition(".")
    module = model.get_submodule(module_name)
    param = getattr(module, leaf)
    if param.is_meta:  # its first tensor: allocate it for real
        if getattr(module, "keep_fp32", False) and dtype.is_floating_point:
            dtype = torch.float32
        param = nn.Parameter(torch.empty(param.shape, device=device, dtype=dtype), requires_grad=False)
        setattr(module, leaf, param)
    rows = param.flatten(0, param.dim() - tensor.dim()) if tensor.dim() < param.dim() else param
    rows[row : row + tensor.shape[0]].copy_(tensor)


def random_model(
    config: ModelConfig, dtype: torch.dtype, device: torch.device, seed: int = 0, shard: Shard | None = None
) -> nn.Module:
    """A model of `config`'s shape with random weights (N(0, 0.02), norms 1) and no checkpoint, for
    benchmarks and checks: each checkpoint tensor drawn whole on `device` from a generator seeded by
    `seed` and its place in the checkpoint's order, so a tensor-parallel rank (`shard`) holds exactly
    its slices of the model one process gets. An MXFP4 model's experts are random MXFP4 bytes; an FP8
    model's (DeepSeek's) decoder linears are held as its checkpoint's are (`keep_checkpoint_fp8`),
    random weights quantized per 128 x 128 block."""
    with torch.device("meta"):
        whole = model_class(config)(config)
        model = model_class(config)(local_config(config, shard.size) if shard is not None else config)
        if config.quantization == "mxfp4":
            whole.keep_experts_mxfp4()
            model.keep_experts_mxfp4()
        if config.quantization == "fp8":  # as DeepSeek's checkpoint stores them: the decoder layers' linears
            scaled = {n for n in checkpoint_layout(whole) if n.startswith("model.layers.") and n.endswith(".weight")}
            keep_checkpoint_fp8(whole, scaled, dtype)
            keep_checkpoint_fp8(model, scaled, dtype)
        whole = checkpoint_layout(whole)
    expected = checkpoint_layout(model, shard)
    names = [n for n in sorted(whole) if not (config.tie_word_embeddings and n == "lm_head.weight")]
    for i, name in enumerate(names):
        shape = whole[name][2]
        if expected[name][0] is None or name.endswith("_scale_inv"):  # another rank's expert; a scale, with its weight
            continue
        if name.endswith("norm.weight"):
            tensor = torch.ones(shape, device=device)
        elif name.endswith(MXFP4_PARTS):  # random e2m1 bytes; scales 2^-8 .. 2^-5, as trained weights' are
            generator = torch.Generator(device=device).manual_seed(seed * 1_000_003 + i)
            low, high = (0, 256) if name.endswith("blocks") else (119, 123)
            tensor = torch.randint(low, high, shape, generator=generator, device=device, dtype=torch.uint8)
            _put(model, expected[name][0], 0, tensor, device, torch.uint8)
            continue
        else:
            generator = torch.Generator(device=device).manual_seed(seed * 1_000_003 + i)
            tensor = torch.randn(shape, generator=generator, device=device) * 0.02
        param_name, row, _ = expected[name]
        scale_name = name + "_scale_inv"
        if scale_name in expected:  # held in FP8: the weight and its block scales, each sliced as the loader reads them
            tensor, scale = quantize_fp8_block(tensor)
            _put(model, *expected[scale_name][:2], slice_for(scale_name, scale, shard), device, torch.float32)
            _put(model, param_name, row, slice_for(name, tensor, shard), device, tensor.dtype)
            continue
        _put(model, param_name, row, slice_for(name, tensor, shard), device, dtype)
        del tensor
    model.finish_loading(device, shard)
    return model.eval()


# A safetensors file copied tensor by tensor, as raw bytes (make_draft's subsets of a checkpoint).
COPY_CHUNK = 16 << 20  # bytes copied at a time


def read_header(path: Path) -> tuple[dict, int]:
    """A safetensors file's header ({name: {dtype, shape, data_offsets}, "__metadata__": ...}) and
    the offset in the file where its tensor data starts."""
    try:
        with open(path, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(size))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path}: cannot read its safetensors header ({e})") from e
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: its safetensors header is not a JSON object")
    return header, 8 + size


def copy_tensors(sources: dict[str, Path], dest: Path, metadata: dict[str, str]) -> None:
    """Write the safetensors file `dest` of the tensors {name: file it is in}, in that order, with
    `metadata`: the header from the sources' entries, then each tensor's bytes copied in chunks."""
    headers = {file: read_header(file) for file in set(sources.values())}
    entries, offset = {}, 0
    for name, file in sources.items():
        entry = headers[file][0][name]
        begin, end = entry["data_offsets"]
        entries[name] = {
            "dtype": entry["dtype"],
            "shape": entry["shape"],
            "data_offsets": [offset, offset + end - begin],
        }
        offset += end - begin
    header = json.dumps({"__metadata__": metadata, **entries} if metadata else entries, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)  # data aligned to 8 bytes, as the safetensors library writes it
    buffer = memoryview(bytearray(COPY_CHUNK))
    with open(dest, "wb") as out:
        out.write(len(header).to_bytes(8, "little"))
        out.write(header)
        for name, file in sources.items():
            begin, end = headers[file][0][name]["data_offsets"]
            with open(file, "rb") as src:
                src.seek(headers[file][1] + begin)
                left = end - begin
                while left:
                    n = src.readinto(buffer[: min(left, COPY_CHUNK)])
                    if not n:
                        raise CheckpointError(f"{file}: ends inside tensor {name!r} (truncated)")
                    out.write(buffer[:n])
                    left -= n


def forward_weight_bytes(model: nn.Module) -> int:
    """The weight bytes a forward reads at least: each linear's (the LM head's too, tied or not) in the
    smallest form the model holds them: a module's `blocks` (the CPU backend's GGUF blocks, whose
    `nbytes` its kernels read) where it has them, else its dense weight, or its FP8 weight and its
    scales; a mixture of experts' parameters (FP8 ones with their scales) by its share per token.
    The embedding table is only looked up, row by row. Call before the CPU backend packs the dense
    linears (their packed form hides its size)."""
    total, kept_dense = 0, set()
    for module in model.modules():  # a parent before its children
        share = getattr(module, "weight_share_per_token", None)
        if share is not None:  # a mixture of experts: one token reads its top-k experts' weights
            total += int(share * sum(p.numel() * p.element_size() for p in module.parameters()))
            continue
        blocks = getattr(module, "blocks", None)
        if blocks is not None:
            total += blocks.nbytes
            kept_dense.add(id(getattr(module, "dense", None)))  # the larger batches' copy
        elif isinstance(module, (nn.Linear, Fp8Linear)) and id(module) not in kept_dense:
            total += module.weight.numel() * module.weight.element_size()
            if isinstance(module, Fp8Linear):  # and its scales
                total += module.scale.numel() * module.scale.element_size()
    return total
