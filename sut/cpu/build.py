"""The CPU engine's C kernels (quant.c, attention.c, ops.c, layer.c), built with the system's C compiler
on first use, once per instruction-set level, and cached under $SAAF_CACHE/build.

Levels, lowest first: `portable` (plain C with the compiler's vectors; any CPU and compiler, ARM
included), `avx2` (AVX2 and FMA: x86-64 from 2013 on) and `avx512` (AVX-512 F/BW/VL/DQ with VNNI).
Each computes the same products. The engine takes the highest level this CPU runs; the
environment setting SAAF_CPU_ISA=portable|avx2|avx512 forces one (a lower one, to test or measure
it; a level the CPU lacks is refused by name), and holds oneDNN to it as well. `library(level)`
gives any runnable level, so the tests can run every path this machine has.
"""

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import warnings
from pathlib import Path

from sut.errors import ConfigError
from systems.schema import saaf_cache

LEVELS = ("portable", "avx2", "avx512")  # lowest first; the C side reports its level as the index
ISA_ENV = "SAAF_CPU_ISA"
SOURCES = [Path(__file__).with_name(name) for name in ("quant.c", "attention.c", "ops.c", "layer.c")]
CFLAGS = ["-O3", "-fopenmp", "-shared", "-fPIC", "-Wno-psabi"]
LEVEL_FLAGS = {
    "portable": [],
    "avx2": ["-mavx2", "-mfma", "-mf16c"],
    "avx512": ["-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512vnni"],
}
# /proc/cpuinfo flags each level needs (x86-64 only; elsewhere only `portable` is built)
CPU_FLAGS = {
    "avx2": {"avx2", "fma", "f16c"},
    "avx512": {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"},
}


def _cpu_flags() -> set[str]:
    for line in _cpuinfo_lines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def runnable_levels() -> list[str]:
    """The levels this CPU can run, lowest first."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return ["portable"]
    flags = _cpu_flags()
    return ["portable"] + [level for level in LEVELS[1:] if CPU_FLAGS[level] <= flags]


def selected_level() -> str:
    """The level the engine uses: SAAF_CPU_ISA when set, else the highest this CPU runs."""
    forced = os.environ.get(ISA_ENV, "").strip().lower()
    runnable = runnable_levels()
    if not forced:
        return runnable[-1]
    if forced not in LEVELS:
        raise ConfigError(f"{ISA_ENV}={forced!r} is not one of {list(LEVELS)}")
    if forced not in runnable:
        raise ConfigError(f"{ISA_ENV}={forced!r}: this CPU lacks it (it runs {runnable})")
    return forced


# A forced level stands for a CPU without the higher ones, so oneDNN (the dense fp32 linears) is
# held to it too: its ISA cap, read at its first use.
ONEDNN_ISA = {"portable": "SSE41", "avx2": "AVX2"}


def hold_onednn_to_forced_level() -> None:
    forced = os.environ.get(ISA_ENV, "").strip().lower()
    if forced in ONEDNN_ISA and platform.machine().lower() in ("x86_64", "amd64"):
        os.environ.setdefault("ONEDNN_MAX_CPU_ISA", ONEDNN_ISA[forced])


hold_onednn_to_forced_level()


# The instruction-set flags a run record names (x86 "flags", Arm "Features" in /proc/cpuinfo).
RECORDED_FLAGS = (
    "sse4_2",
    "avx",
    "f16c",
    "fma",
    "avx2",
    "avx_vnni",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512dq",
    "avx512_vnni",
    "avx512_bf16",
    "amx_tile",
    "asimd",
    "asimddp",
    "sve",
    "sve2",
)


def cpu_description() -> str:
    """The CPU, its cores, its SIMD flags and the kernel level the engine takes here, for run records."""
    lines = _cpuinfo_lines()
    model = next(
        (line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")),
        platform.processor() or platform.machine(),
    )
    present = set(next((line.split(":", 1)[1].split() for line in lines if line.startswith(("flags", "Features"))), []))
    flags = " ".join(f for f in RECORDED_FLAGS if f in present) or "unknown"
    lib = library()
    kernels = f"C kernels at the {lib.level} level" if lib is not None else "no C kernels (PyTorch ops only)"
    onednn = os.environ.get("ONEDNN_MAX_CPU_ISA")
    held = f", oneDNN held to {onednn}" if onednn else ""
    return (
        f"{model}, {os.cpu_count()} cores ({platform.machine()}; flags {flags}); {kernels}{held} "
        f"(this CPU runs {runnable_levels()})"
    )


def _cpuinfo_lines() -> list[str]:
    try:
        return Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return []


def _cache_dir() -> Path:
    return saaf_cache() / "build"


def _build(level: str) -> ctypes.CDLL:
    compiler = shutil.which(os.environ.get("CC", "cc"))
    flags = CFLAGS + LEVEL_FLAGS[level]
    sources = b"".join(source.read_bytes() for source in SOURCES)
    key = hashlib.sha256(sources + " ".join(flags).encode()).hexdigest()[:16]
    path = _cache_dir() / f"cpu_kernels-{platform.machine()}-{level}-{key}.so"
    if not path.is_file():
        if compiler is None:
            raise RuntimeError("no C compiler (cc) on PATH")
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        done = subprocess.run(
            [compiler, *flags, *map(str, SOURCES), "-o", str(tmp), "-lm"], capture_output=True, text=True
        )
        if done.returncode != 0:
            raise RuntimeError(f"{compiler} failed for the {level} level: {done.stderr.strip()[-500:]}")
        os.replace(tmp, path)
    lib = ctypes.CDLL(str(path))
    built = LEVELS[lib.cpu_kernels_level()]
    if built != level:  # a compiler that took the flags but does not define the ISA macros
        raise RuntimeError(f"{compiler} built the {level} level as {built}")
    ptr, i64 = ctypes.c_void_p, ctypes.c_long
    lib.q4_1_matmul.argtypes = [ptr, ptr, ptr, ptr, ptr, i64, i64, i64]
    lib.q8_0_matmul.argtypes = [ptr, ptr, ptr, ptr, i64, i64, i64]
    lib.q4_1_matmul_i16.argtypes = [ptr, ptr, ptr, ptr, ptr, i64, i64, i64]
    lib.q8_0_matmul_i16.argtypes = [ptr, ptr, ptr, ptr, i64, i64, i64]
    lib.paged_decode_attention.argtypes = [
        ptr,
        ptr,
        ptr,
        ptr,
        ptr,
        i64,
        i64,
        ptr,
        ptr,
        i64,
        i64,
        i64,
        i64,
        ctypes.c_float,
    ]
    lib.decode_attention_available.argtypes = [i64, i64, i64]
    lib.rms_norm_f32.argtypes = [ptr, ptr, ptr, ptr, ptr, i64, i64, ctypes.c_float]
    lib.rotary_f32.argtypes = [ptr, i64, ptr, ptr, i64, ptr, ptr, i64, i64, i64, i64]
    lib.store_kv_f32.argtypes = [ptr, i64, ptr, i64, ptr, ptr, ptr, i64, i64]
    lib.silu_mul_f32.argtypes = [ptr, ptr, i64, i64]
    lib.exp_nonpositive_f32.argtypes = [ptr, i64]
    lib.decode_layers.argtypes = [
        ptr,
        i64,
        ptr,
        ptr,
        ptr,
        ptr,
        ptr,
        ptr,
        ptr,
        ptr,
        ptr,
        i64,
        i64,
        i64,
        i64,
        i64,
        i64,
        ctypes.c_float,
        ctypes.c_float,
    ]
    lib.decode_layers.restype = ctypes.c_int
    for fn in ("rms_norm_f32", "rotary_f32", "store_kv_f32", "silu_mul_f32", "exp_nonpositive_f32"):
        getattr(lib, fn).restype = None
    for fn in (
        "q4_1_matmul",
        "q8_0_matmul",
        "q4_1_matmul_i16",
        "q8_0_matmul_i16",
        "paged_decode_attention",
        "decode_attention_available",
        "cpu_kernels_level",
    ):
        getattr(lib, fn).restype = ctypes.c_int
    lib.level = level
    return lib


_libraries: dict[str, ctypes.CDLL | None] = {}


def _load(level: str) -> ctypes.CDLL | None:
    if level not in _libraries:
        try:
            _libraries[level] = _build(level)
        except (OSError, RuntimeError) as e:
            warnings.warn(f"sut.cpu.build: the {level} C kernels are unavailable ({e})")
            _libraries[level] = None
    return _libraries[level]


def library(level: str | None = None) -> ctypes.CDLL | None:
    """The kernels at `level` (default: selected_level(), or the next lower level that builds),
    built once; None, with a warning, when they cannot be built here: then CPU linears use their
    fp32 weights and attention the PyTorch op."""
    if level is not None:
        return _load(level)
    top = LEVELS.index(selected_level())
    return next((lib for lib in map(_load, reversed(LEVELS[: top + 1])) if lib is not None), None)
