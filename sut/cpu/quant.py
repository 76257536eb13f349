"""Small-batch CPU linears computed from the checkpoint's GGUF blocks (Q4_1 and Q8_0).

The demo model comes as a GGUF file whose linear layers are Q4_1 and whose embedding (tied to
the LM head) is Q8_0; `sut.tools.convert_gguf` writes the fp32 checkpoint from them and keeps the
raw blocks beside it in GGUF_BLOCKS_FILE, in a subfolder so that the loader, which takes the
folder's own `*.safetensors` for the checkpoint, never reads them as a shard. Rebuilt in fp32, a
block gives back the checkpoint's weights bit for bit (checked at load), so computing from the
blocks changes only the order of the sums, as any other GEMM would. What changes is the bytes
read: a decode step is bound by reading the weights, and the blocks are 6.4x (Q4_1) and 3.8x
(Q8_0) smaller than fp32.

The kernels (quant.c) are built by sut.cpu.build for the CPU's instruction-set level
(AVX-512, AVX2 or portable C). Their compute is fp32 FMA, so for more than BLOCK_ROWS_MAX rows
oneDNN's packed fp32 GEMM is faster and each layer switches to it. Without a compiler the engine
runs the fp32 path alone.

The engine setting cpu.int16_activations trades exactness for speed: the inputs are rounded to int16
per block of 32 and multiplied with the codes in exact integer sums (AVX512-VNNI's vpdpwssd,
AVX2's vpmaddwd; quant.c says how, and how large the error can be).
"""

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from sut.cpu.build import library
from sut.errors import CheckpointError
from sut.model.llama import FusedLinear
from sut.model.loader import checkpoint_layout, copy_tensors, read_header, tensor_names

GGUF_BLOCKS_FILE = "cpu/gguf-blocks.safetensors"  # in the model folder

BLOCK = 32  # weights per block in both formats
BLOCK_BYTES = {"Q4_1": 20, "Q8_0": 34}  # fp16 d [, fp16 m], then the codes
# Up to this many rows the exact block kernels beat oneDNN's fp32 GEMM, per instruction-set level
# and format (`python -m sut.bench.steps` decode steps at batch 1-16 on 2 cores, with and without
# blocks; the portable level's from timing each kernel against oneDNN held to SSE4.1, where the
# exact Q4_1 kernel is slower at any size and the exact Q8_0 one faster up to 32 rows at least).
BLOCK_ROWS_MAX = {"portable": {"Q4_1": 0, "Q8_0": 32}, "avx2": {"Q4_1": 8, "Q8_0": 8}, "avx512": {"Q4_1": 8, "Q8_0": 8}}
# Up to this many rows the int16 kernels beat both; above, an int16 layer computes exactly, from
# its blocks up to BLOCK_ROWS_MAX rows and on its dense weights beyond (faster there, and exact).
# The portable int16 Q8_0 kernel is slower than the exact one at any size.
INT16_ROWS_MAX = {
    "portable": {"Q4_1": 4, "Q8_0": 0},
    "avx2": {"Q4_1": 16, "Q8_0": 16},
    "avx512": {"Q4_1": 1 << 30, "Q8_0": 1 << 30},
}


@dataclass
class BlockWeights:
    """One weight matrix [rows, cols] in GGUF blocks, split for the kernels: codes `qs` (uint8,
    [rows, cols / 2] packed nibbles for Q4_1, [rows, cols] int8 for Q8_0), scales `d` and, for
    Q4_1, minimums `m` (fp32, [rows, cols / 32])."""

    format: str
    qs: torch.Tensor
    d: torch.Tensor
    m: torch.Tensor | None
    _int16: tuple | None = field(default=None, repr=False)

    @property
    def nbytes(self) -> int:
        """What a kernel reads of it: codes, scales and minimums."""
        return sum(t.numel() * t.element_size() for t in (self.qs, self.d, self.m) if t is not None)

    @staticmethod
    def from_raw(raw: torch.Tensor, format: str) -> "BlockWeights":
        """From the file's bytes, uint8 [rows, cols / 32, BLOCK_BYTES[format]]."""
        d = raw[..., 0:2].contiguous().view(torch.float16)[..., 0].float()
        if format == "Q4_1":
            m = raw[..., 2:4].contiguous().view(torch.float16)[..., 0].float()
            return BlockWeights(format, raw[..., 4:].reshape(raw.shape[0], -1).contiguous(), d, m)
        return BlockWeights(format, raw[..., 2:].reshape(raw.shape[0], -1).contiguous(), d, None)

    @property
    def shape(self) -> tuple[int, int]:
        return self.d.shape[0], self.d.shape[1] * BLOCK

    def dequantize(self) -> torch.Tensor:
        """The fp32 weights, as gguf computes them (d * q exact, one rounding for + m)."""
        rows, cols = self.shape
        w = self.d[..., None] * self.codes().float().view(rows, -1, BLOCK)
        return (w if self.m is None else w + self.m[..., None]).reshape(rows, cols)

    def codes(self) -> torch.Tensor:
        """The codes as uint8 [rows, cols] (0..15 for Q4_1) or int8 [rows, cols] (Q8_0)."""
        rows, cols = self.shape
        if self.format == "Q4_1":
            q = self.qs.view(rows, -1, 1, BLOCK // 2)
            return torch.cat((q & 15, q >> 4), dim=2).reshape(rows, cols)
        return self.qs.view(torch.int8).view(rows, cols)

    def int16_layout(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The codes and scales arranged for the int16 kernels (quant.c), built once: rows in
        groups of 16 (padded with zeros to a multiple of 32), per group and block the codes of each
        k-pair as 16 lanes (one per row) of two values, and d, m as [groups, blocks, 16]."""
        if self._int16 is None:
            rows, cols = self.shape
            nb, padded = cols // BLOCK, -(-rows // 32) * 32
            codes = torch.zeros(padded, cols, dtype=torch.int16)
            codes[:rows] = self.codes()
            if (
                self.format == "Q4_1"
            ):  # [group, row, block, c, t, h] -> per (group, block, c): [row, h] int16 of 4 nibbles t
                q = codes.view(-1, 16, nb, 4, 4, 2).permute(0, 2, 3, 1, 5, 4)
                packed = (q << torch.tensor([0, 4, 8, 12], dtype=torch.int16)).sum(-1, dtype=torch.int16)
                packed = packed.contiguous().view(torch.uint8)
            else:  # [group, row, block, j, h] -> per (group, block, j): [row, h] int8
                packed = (
                    codes.view(-1, 16, nb, 16, 2).permute(0, 2, 3, 1, 4).to(torch.int8).contiguous().view(torch.uint8)
                )

            def per_group(t: torch.Tensor) -> torch.Tensor:
                out = torch.zeros(padded, nb)
                out[:rows] = t
                return out.view(-1, 16, nb).transpose(1, 2).contiguous()

            self._int16 = (packed, per_group(self.d), None if self.m is None else per_group(self.m))
        return self._int16

    def matmul_int16(self, x: torch.Tensor, lib=None) -> torch.Tensor:
        """`x [M, cols] @ W^T` with `x` rounded to int16 per block of 32 (quant.c says how), on
        the kernels `lib` (default: the engine's, sut.cpu.build.library())."""
        rows, cols = self.shape
        codes, d, m = self.int16_layout()
        y = torch.empty(x.shape[0], rows)
        lib = lib or library()
        if self.format == "Q4_1":
            rc = lib.q4_1_matmul_i16(
                x.data_ptr(), codes.data_ptr(), d.data_ptr(), m.data_ptr(), y.data_ptr(), x.shape[0], rows, cols
            )
        else:
            rc = lib.q8_0_matmul_i16(x.data_ptr(), codes.data_ptr(), d.data_ptr(), y.data_ptr(), x.shape[0], rows, cols)
        if rc != 0:
            raise RuntimeError(f"sut.cpu.quant: {self.format} int16 kernel failed with code {rc}")
        return y

    def matmul(self, x: torch.Tensor, lib=None) -> torch.Tensor:
        """`x [M, cols] @ W^T` (fp32, contiguous) with the compiled kernel (of `lib`, as above)."""
        rows, cols = self.shape
        y = torch.empty(x.shape[0], rows)
        lib = lib or library()
        if self.format == "Q4_1":
            rc = lib.q4_1_matmul(
                x.data_ptr(),
                self.qs.data_ptr(),
                self.d.data_ptr(),
                self.m.data_ptr(),
                y.data_ptr(),
                x.shape[0],
                rows,
                cols,
            )
        else:
            rc = lib.q8_0_matmul(
                x.data_ptr(), self.qs.data_ptr(), self.d.data_ptr(), y.data_ptr(), x.shape[0], rows, cols
            )
        if rc != 0:
            raise RuntimeError(f"sut.cpu.quant: {self.format} kernel failed with code {rc}")
        return y


class BlockQuantLinear(nn.Module):
    """A linear layer that computes, by the number of input rows: with `int16`, from its blocks
    with int16 inputs (BlockWeights.matmul_int16) up to `int16_rows` (INT16_ROWS_MAX); then
    exactly from its blocks up to `exact_rows` (BLOCK_ROWS_MAX); then from its dense weights
    (`dense`, packed for oneDNN by the runner), which it drops on a level where the blocks take
    every batch. `block_rows`: up to how many rows it takes its own kernel (int16 or exact; what
    the one-call decode layers run). `lib`: the kernels (default: the engine's level,
    sut.cpu.build.library())."""

    def __init__(self, dense: nn.Linear, blocks: BlockWeights, int16: bool = False, lib=None):
        super().__init__()
        self.blocks, self.int16, self.bias = blocks, int16, dense.bias
        self.out_features = dense.out_features
        self.lib = lib or library()
        self.int16_rows = INT16_ROWS_MAX[self.lib.level][blocks.format] if int16 else 0
        self.exact_rows = BLOCK_ROWS_MAX[self.lib.level][blocks.format]
        # Dense weights that are never read are dropped (and the runner does not pack them).
        self.dense = None if max(self.int16_rows, self.exact_rows) >= 1 << 30 else dense
        if int16:
            blocks.int16_layout()  # built at load, not in the first step

    @property
    def block_rows(self) -> int:
        return self.int16_rows if self.int16 else self.exact_rows

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        if flat.shape[0] <= self.int16_rows:
            y = self.blocks.matmul_int16(flat.contiguous(), self.lib)
        elif flat.shape[0] <= self.exact_rows:
            y = self.blocks.matmul(flat.contiguous(), self.lib)
        else:
            return self.dense(x)
        if self.bias is not None:
            y += self.bias
        return y.view(*x.shape[:-1], self.out_features)


def _checkpoint_names(model: nn.Module) -> dict[str, list[str]]:
    """Each weight parameter -> the checkpoint tensors it is made of, in row order (a tied LM head
    is the embedding's)."""
    by_param: dict[str, list[str]] = {}
    for name, (param, _, _) in sorted(checkpoint_layout(model).items(), key=lambda item: item[1][1]):
        by_param.setdefault(param, []).append(name)
    if model.config.tie_word_embeddings:
        by_param["lm_head.weight"] = ["model.embed_tokens.weight"]
    return by_param


def attach_gguf_blocks(model: nn.Module, folder: str | Path, int16: bool = False) -> int:
    """Wrap each fp32 CPU linear of `model` whose weights GGUF_BLOCKS_FILE in `folder` holds in a
    BlockQuantLinear (with int16 inputs if `int16`); return how many. Call before the linears are
    packed (the check needs the dense weights). Does nothing when the file is absent or the kernels
    cannot be built."""
    path = Path(folder) / GGUF_BLOCKS_FILE
    if not path.is_file() or library() is None:
        return 0
    from safetensors import SafetensorError, safe_open  # here: sut imports with torch and numpy alone (gpu_check)

    targets = [
        (name, m)
        for name, m in model.named_modules()
        if type(m) in (nn.Linear, FusedLinear) and m.weight.device.type == "cpu" and m.weight.dtype == torch.float32
    ]
    checkpoint_names = _checkpoint_names(model)
    try:
        with safe_open(path, framework="pt") as f:
            formats = json.loads((f.metadata() or {}).get("formats", "{}"))
            stored = set(f.keys())
            count = 0
            for name, linear in targets:
                names = checkpoint_names[f"{name}.weight"]
                if not all(n in stored for n in names) or len({formats.get(n) for n in names}) != 1:
                    continue
                fmt = formats[names[0]]
                if fmt not in BLOCK_BYTES:
                    raise CheckpointError(f"{path}: tensor {names[0]} has unknown block format {fmt!r}")
                raw = torch.cat([f.get_tensor(n) for n in names])
                if raw.dtype != torch.uint8 or raw.dim() != 3 or raw.shape[2] != BLOCK_BYTES[fmt]:
                    raise CheckpointError(
                        f"{path}: tensor {names[0]} is not uint8 [rows, blocks, {BLOCK_BYTES[fmt]}] "
                        f"{fmt} blocks (got {raw.dtype} {list(raw.shape)})"
                    )
                blocks = BlockWeights.from_raw(raw, fmt)
                if blocks.shape != tuple(linear.weight.shape) or not torch.equal(blocks.dequantize(), linear.weight):
                    raise CheckpointError(
                        f"{path}: the {fmt} blocks of {', '.join(names)} do not rebuild the "
                        f"checkpoint's fp32 weights exactly; reconvert the model folder"
                    )
                parent, _, leaf = name.rpartition(".")
                setattr(model.get_submodule(parent), leaf, BlockQuantLinear(linear, blocks, int16))
                count += 1
    except (SafetensorError, OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: cannot read GGUF blocks ({e})") from e
    return count


def write_gguf_blocks(tensors: dict[str, tuple[torch.Tensor, str]], folder: Path) -> None:
    """Write {checkpoint name: (raw uint8 blocks, format)} as the model folder's GGUF_BLOCKS_FILE (for
    convert_gguf)."""
    from safetensors.torch import save_file

    path = Path(folder) / GGUF_BLOCKS_FILE
    path.parent.mkdir(exist_ok=True)
    save_file(
        {n: raw.contiguous() for n, (raw, _) in tensors.items()},
        str(path),
        metadata={"formats": json.dumps({n: fmt for n, (_, fmt) in tensors.items()})},
    )


def copy_blocks_of(target: Path, out: Path, keep) -> None:
    """Give the model folder `out` the blocks of `target`'s GGUF_BLOCKS_FILE of the tensors that
    `keep(name)` accepts, with their formats (for a draft made of some of a target's tensors);
    nothing when `target` has none."""
    blocks = target / GGUF_BLOCKS_FILE
    if not blocks.is_file():
        return
    tensor_names(target, [blocks])  # a file safetensors cannot read is refused here, by name
    header, _ = read_header(blocks)
    meta = dict(header.get("__metadata__") or {})
    try:
        formats = json.loads(meta.get("formats", "{}"))
    except ValueError as e:
        raise CheckpointError(f"{blocks}: its 'formats' metadata is not JSON ({e})") from e
    names = [n for n in header if n != "__metadata__" and keep(n)]
    meta["formats"] = json.dumps({n: formats[n] for n in names if n in formats})
    (out / GGUF_BLOCKS_FILE).parent.mkdir(parents=True, exist_ok=True)
    copy_tensors(dict.fromkeys(names, blocks), out / GGUF_BLOCKS_FILE, meta)
