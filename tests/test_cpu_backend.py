"""The CPU backend stays in sut/cpu/: the device-neutral engine files name none of its specifics,
its settings come as the engine's `cpu` object, and its GGUF blocks live in a subfolder of the
model folder that the loader does not take for a checkpoint shard (a folder of the older layout is
refused by name, and the converter rewrites it)."""

import re
import shutil
from pathlib import Path

import pytest

from harness.config import System
from sut.config import EngineConfig
from sut.cpu.quant import GGUF_BLOCKS_FILE
from sut.errors import CheckpointError
from sut.tools.convert_gguf import DONE_MARKER, folder_is_intact, sha256_of

SUT = Path(__file__).resolve().parents[1] / "sut"
CPU_WORDS = re.compile(r"gguf|glibc|mallopt|onednn|mkldnn", re.IGNORECASE)


def test_device_neutral_files_name_no_cpu_specifics():
    found = [
        f"{path.name}:{n}: {line.strip()}"
        for path in sorted(SUT.glob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if CPU_WORDS.search(line)
    ]
    assert not found, "CPU backend specifics outside sut/cpu/:\n" + "\n".join(found)


def test_the_demo_systems_engine_settings_hold():
    demo = System.load("cpu-demo")
    for scenario in demo.scenarios:
        config = EngineConfig.from_kwargs(**demo.engine_settings(scenario))
        assert config.cpu.int16_activations and config.cpu.quantized_weights


def test_a_second_copy_of_a_tensor_is_refused_by_name(tiny_llama, tmp_path):
    """What an older converter left: the blocks as a second *.safetensors beside the checkpoint."""
    from sut import LLM

    for f in tiny_llama[0].iterdir():
        shutil.copy(f, tmp_path / f.name)
    shutil.copy(tmp_path / "model.safetensors", tmp_path / "gguf-blocks.safetensors")
    with pytest.raises(CheckpointError, match=r"tensor '.*' is in both gguf-blocks.safetensors and model.safetensors"):
        LLM(tmp_path, num_kv_blocks=32)


def _converted_folder(folder: Path, blocks: str) -> Path:
    for name in ("config.json", blocks):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(name)
    (folder / "SHA256SUMS").write_text("".join(f"{sha256_of(folder / n)}  {n}\n" for n in ("config.json", blocks)))
    (folder / DONE_MARKER).write_text("converted\n")
    return folder


def test_the_converter_redoes_a_folder_of_the_older_layout(tmp_path):
    assert folder_is_intact(_converted_folder(tmp_path / "new", GGUF_BLOCKS_FILE))
    assert not folder_is_intact(_converted_folder(tmp_path / "old", "gguf-blocks.safetensors"))
