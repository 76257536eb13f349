"""Imports run one way (README, Layout): each package may import only the packages of ours listed
for it. Every .py under those packages is parsed, imports at any depth (inside functions too),
`from x import`, and relative imports resolved against the file's package."""

import ast
import sys
from pathlib import Path

from systems.schema import REPO

# package -> the packages of ours it may import (besides itself)
ALLOWED = {
    "kernels": set(),
    "sut": {"kernels"},
    "systems": set(),
    "accuracy": {"systems"},
    "compliance": {"accuracy", "systems"},
    "harness": {"sut", "accuracy", "compliance", "systems"},
}
# Files that are commands at the top of the chain rather than parts of their package: gpu_check
# (`python3 -m kernels.gpu_check`, the one command a lent GPU machine runs) also times the engine.
COMMANDS = {"kernels/gpu_check.py": {"sut"}}
OURS = set(ALLOWED) | {"tests"}
# The engine never drives LoadGen; systems is read by everyone, so it needs nothing installed.
FORBIDDEN_THIRD_PARTY = {"sut": {"mlperf_loadgen"}}
STDLIB_ONLY = {"systems"}


def imported_modules(tree: ast.AST, package_parts: list[str]):
    """(line, dotted module name) of every import in `tree`; `package_parts`: the file's package,
    against which relative imports are resolved."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package_parts[: len(package_parts) - node.level + 1]
                yield node.lineno, ".".join(base + ([node.module] if node.module else []))
            else:
                yield node.lineno, node.module


def forbidden_imports(root: Path) -> list[str]:
    """'file:line: a -> b' for every import under `root`'s packages that ALLOWED forbids."""
    found = []
    for package, allowed in ALLOWED.items():
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            package_parts = parts if parts[-1] == "__init__" else parts[:-1]
            package_parts = [p for p in package_parts if p != "__init__"]
            for line, module in imported_modules(ast.parse(path.read_text(), str(path)), package_parts):
                top = module.split(".")[0]
                also = COMMANDS.get(path.relative_to(root).as_posix(), set())
                ours_forbidden = top in OURS and top != package and top not in allowed | also
                third_party_forbidden = top not in OURS and (
                    top in FORBIDDEN_THIRD_PARTY.get(package, ())
                    or (package in STDLIB_ONLY and top not in sys.stdlib_module_names)
                )
                if ours_forbidden or third_party_forbidden:
                    found.append(f"{path.relative_to(root)}:{line}: {package} -> {top} ({module})")
    return found


def test_imports_run_one_way():
    assert forbidden_imports(REPO) == []


def test_every_package_is_parsed():
    """Nothing passes because a folder was missed or renamed."""
    for package in ALLOWED:
        assert (REPO / package / "__init__.py").is_file(), package


def test_the_checker_catches_forbidden_imports(tmp_path):
    for package in ALLOWED:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "compliance" / "deep").mkdir()
    (tmp_path / "compliance" / "deep" / "__init__.py").write_text("")
    (tmp_path / "compliance" / "ok.py").write_text("import json\nfrom accuracy import report\nfrom . import audit\n")
    (tmp_path / "compliance" / "bad.py").write_text("import json\n\n\ndef f():\n    import harness.config\n")
    (tmp_path / "compliance" / "deep" / "rel.py").write_text("from ...sut import engine\n")
    (tmp_path / "harness" / "bad.py").write_text("from kernels.rms_norm import rms_norm\n")
    (tmp_path / "sut" / "bad.py").write_text("import mlperf_loadgen as lg\nfrom kernels import attention\n")
    (tmp_path / "systems" / "bad.py").write_text("from harness import config\nimport torch\nimport json\n")
    assert forbidden_imports(tmp_path) == [
        "sut/bad.py:1: sut -> mlperf_loadgen (mlperf_loadgen)",
        "systems/bad.py:1: systems -> harness (harness)",
        "systems/bad.py:2: systems -> torch (torch)",
        "compliance/bad.py:5: compliance -> harness (harness.config)",
        "compliance/deep/rel.py:1: compliance -> sut (sut)",
        "harness/bad.py:1: harness -> kernels (kernels.rms_norm)",
    ]
