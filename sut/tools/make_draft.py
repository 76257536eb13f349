"""Make a layer-skip draft model for speculative decoding from a target model folder: the target's
first N decoder layers, its final norm and its LM head (tied embeddings stay tied), with the
target's tokenizer, so the draft proposes tokens in the target's vocabulary.

    python -m sut.tools.make_draft --target DIR --layers N --out DIR

OUT gets:
  config.json        the target's, num_hidden_layers = N, and "saaf_draft": {"target", "layers",
                     "target_layers"} saying where it came from (ModelConfig ignores the key)
  model.safetensors  the kept tensors (model.layers.0..N-1, embed_tokens, model.norm, lm_head),
                     their bytes and dtypes as in the target's (single or sharded) checkpoint
  cpu/...            the CPU backend's quantized blocks of the kept tensors, when the target has
                     them (sut/cpu/quant.py), so it computes the draft from them as it does the target
  every other file at the top of the target folder (tokenizer, generation config, chat template,
  vocab/merges...), byte for byte, except weights, index files, checksums and dotfiles (the
  converter's .converted marker).

The draft gets a SHA256SUMS of its own files (the target's describes the target's), which the engine
checks before loading it (sut/model/checksums.py).

Tensors are copied one at a time, their bytes 16 MB at a time, from the target's files: nothing
is loaded whole. The draft is written to a hidden folder beside OUT and renamed into place when complete,
so a folder at OUT is either whole or absent; an OUT that holds anything but a previous draft is
refused.
"""

import argparse
import json
import os
import re
import shutil
from pathlib import Path

from sut.config import ModelConfig
from sut.cpu.quant import copy_blocks_of
from sut.errors import ConfigError, SaafError, run_cli
from sut.model.checksums import write_sums
from sut.model.loader import copy_tensors, read_header, tensor_names, weight_files

DRAFT_KEY = "saaf_draft"  # in the draft's config.json
LAYER = re.compile(r"model\.layers\.(\d+)\.")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".index.json")
CHECKSUMS = ("SHA256SUMS", "MD5SUMS", "SHA1SUMS")


def kept(name: str, layers: int) -> bool:
    """A tensor the draft keeps: any of the first `layers` decoder layers', and the rest of the model's."""
    match = LAYER.match(name)
    return match is None or int(match.group(1)) < layers


def is_draft(folder: Path) -> bool:
    try:
        return DRAFT_KEY in json.loads((folder / "config.json").read_text())
    except (OSError, ValueError, TypeError):
        return False


def is_weight_or_checksum(name: str) -> bool:
    return name.startswith(".") or name.endswith(WEIGHT_SUFFIXES) or name in CHECKSUMS


def check_out(out: Path, target: Path) -> None:
    if out.resolve() == target.resolve():
        raise ConfigError(f"--out {out} is the target folder itself; choose another folder")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is not a folder")
    if out.is_dir() and any(out.iterdir()) and not is_draft(out):
        raise ConfigError(
            f"--out {out} is not empty and not a draft (its config.json has no {DRAFT_KEY!r}); "
            "choose another folder or empty it"
        )


def draft_weights(target: Path, layers: int) -> dict[str, Path]:
    """{name: file} of the target checkpoint's tensors that the draft keeps, in file order. Whether
    they make a whole model is the loader's to say, when the draft loads, as for the target."""
    return {
        name: file
        for file, names in tensor_names(target, weight_files(target)).items()
        for name in names
        if kept(name, layers)
    }


def write_draft(target: Path, layers: int, out: Path, config: ModelConfig, raw_config: dict) -> None:
    """Write the whole draft into `out`, an empty folder; config.json last."""
    sources = draft_weights(target, layers)
    metadata = {}
    for file in dict.fromkeys(sources.values()):
        metadata.update(read_header(file)[0].get("__metadata__") or {})
    copy_tensors(sources, out / "model.safetensors", metadata or {"format": "pt"})

    copy_blocks_of(target, out, lambda name: kept(name, layers))

    for path in sorted(target.iterdir()):
        if path.is_file() and path.name != "config.json" and not is_weight_or_checksum(path.name):
            shutil.copyfile(path, out / path.name)

    draft_config = {
        **raw_config,
        "num_hidden_layers": layers,
        DRAFT_KEY: {"target": str(target), "layers": layers, "target_layers": config.num_layers},
    }
    (out / "config.json").write_text(json.dumps(draft_config, indent=2) + "\n")
    write_sums(out)


def make_draft(target: str | Path, layers: int, out: str | Path) -> Path:
    """Write a draft of `target`'s first `layers` layers at `out` (see the module's doc); return `out`."""
    target, out = (Path(os.path.abspath(Path(p).expanduser())) for p in (target, out))
    if not target.is_dir():
        raise ConfigError(f"--target {target}: no such model folder")
    config = ModelConfig.from_folder(target)  # no config.json, or a model the engine does not run
    if isinstance(layers, bool) or not isinstance(layers, int) or not 1 <= layers < config.num_layers:
        raise ConfigError(
            f"--layers {layers!r} is out of range: a draft of {target} ({config.num_layers} layers) "
            f"keeps 1 to {config.num_layers - 1} of them"
        )
    check_out(out, target)
    raw_config = json.loads((target / "config.json").read_text())

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp, old = out.with_name(f".{out.name}.tmp"), out.with_name(f".{out.name}.old")
    for leftover in (tmp, old):  # from a run that crashed
        shutil.rmtree(leftover, ignore_errors=True)
    tmp.mkdir()
    try:
        write_draft(target, layers, tmp, config, raw_config)
        if out.exists():  # empty, or a previous draft: moved aside, then removed once the new one is in place
            os.replace(out, old)
        os.replace(tmp, out)
    finally:
        if old.exists() and not out.exists():  # the new draft did not make it: the previous one stays
            os.replace(old, out)
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--target", type=Path, required=True, help="the target model folder")
    parser.add_argument("--layers", type=int, required=True, help="decoder layers the draft keeps (its first N)")
    parser.add_argument("--out", type=Path, required=True, help="folder to write the draft to")
    args = parser.parse_args()
    out = make_draft(args.target, args.layers, args.out)
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    origin = json.loads((out / "config.json").read_text())[DRAFT_KEY]
    print(
        f"make_draft: wrote {out}: {origin['layers']} of {origin['target_layers']} layers of {origin['target']}, "
        f"{size / 1e6:.1f} MB"
    )


def cli() -> None:
    run_cli(main, (SaafError, OSError))  # OSError: an --out that cannot be written


if __name__ == "__main__":
    cli()
