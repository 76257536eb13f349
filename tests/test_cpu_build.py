"""Which instruction-set level of the C kernels runs (sut/cpu/build.py): the CPU's own flags decide,
SAAF_CPU_ISA forces a lower one, a level the CPU lacks or an unknown name is refused by name, and
every level this CPU runs builds and says it is that level."""

import pytest

from sut import machine_description
from sut.cpu import build
from sut.cpu.build import LEVELS, library, runnable_levels, selected_level
from sut.errors import ConfigError
from tests.helpers import LEVELS as RUNNABLE

AVX2 = {"sse2", "avx", "avx2", "fma", "f16c"}
AVX512 = AVX2 | {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"}


@pytest.mark.parametrize(
    "machine, flags, levels",
    [
        ("x86_64", {"sse2"}, ["portable"]),
        ("x86_64", AVX2, ["portable", "avx2"]),
        ("x86_64", AVX512 - {"avx512_vnni"}, ["portable", "avx2"]),  # AVX-512 without VNNI: the AVX2 kernels
        ("x86_64", AVX512, ["portable", "avx2", "avx512"]),
        ("aarch64", set(), ["portable"]),
        ("arm64", set(), ["portable"]),
    ],
)
def test_levels_follow_the_cpu(monkeypatch, machine, flags, levels):
    monkeypatch.setattr(build.platform, "machine", lambda: machine)
    monkeypatch.setattr(build, "_cpu_flags", lambda: flags)
    monkeypatch.delenv(build.ISA_ENV, raising=False)
    assert runnable_levels() == levels
    assert selected_level() == levels[-1]


def test_a_forced_level_is_taken_and_a_missing_or_unknown_one_refused(monkeypatch):
    monkeypatch.setattr(build.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(build, "_cpu_flags", lambda: AVX2)
    monkeypatch.setenv(build.ISA_ENV, "portable")
    assert selected_level() == "portable"
    monkeypatch.setenv(build.ISA_ENV, "AVX2")
    assert selected_level() == "avx2"
    monkeypatch.setenv(build.ISA_ENV, "avx512")
    with pytest.raises(ConfigError, match=r"SAAF_CPU_ISA='avx512': this CPU lacks it"):
        selected_level()
    monkeypatch.setenv(build.ISA_ENV, "sse9")
    with pytest.raises(ConfigError, match=r"SAAF_CPU_ISA='sse9' is not one of"):
        selected_level()


def test_a_forced_level_holds_onednn_to_it(monkeypatch):
    monkeypatch.setattr(build.platform, "machine", lambda: "x86_64")
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.setenv(build.ISA_ENV, "avx2")
    build.hold_onednn_to_forced_level()
    assert build.os.environ["ONEDNN_MAX_CPU_ISA"] == "AVX2"


def test_a_cap_set_by_hand_is_kept_and_recorded(monkeypatch):
    """SAAF_CPU_ISA=portable ONEDNN_MAX_CPU_ISA=AVX2: the portable kernels beside this CPU's oneDNN."""
    monkeypatch.setattr(build.platform, "machine", lambda: "x86_64")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    monkeypatch.setenv(build.ISA_ENV, "portable")
    build.hold_onednn_to_forced_level()
    assert build.os.environ["ONEDNN_MAX_CPU_ISA"] == "AVX2"
    assert "oneDNN held to AVX2" in machine_description()


@pytest.mark.parametrize("level", RUNNABLE)
def test_each_runnable_level_builds_as_itself(level):
    lib = library(level)
    assert lib is not None and lib.level == level and LEVELS[lib.cpu_kernels_level()] == level


def test_the_engine_level_is_the_selected_one():
    assert library().level == selected_level()


@pytest.mark.parametrize("level", [level for level in LEVELS if level not in RUNNABLE] or ["none"])
def test_levels_this_cpu_cannot_run(level):
    """Named here, once, so that no other test skips a path silently: a level left out must be one
    whose flags this CPU lacks (not one the tests merely forgot), and then it is skipped by name."""
    if level == "none":  # every level runs here, and every one is tested
        assert set(RUNNABLE) == set(LEVELS) == set(runnable_levels())
        return
    lacking = sorted(build.CPU_FLAGS[level] - build._cpu_flags())
    assert lacking and level not in runnable_levels(), f"{level} runs on this CPU, yet no test runs it"
    pytest.skip(f"this CPU cannot run the {level} kernels (flags it lacks: {lacking})")
