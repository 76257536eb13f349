"""Imports run one way (README, Layout): each package may import only the packages of ours listed
for it, inside sut/ each layer only the layers below it, and inside harness/ the LoadGen run (its
top) below the prediction (harness/predict/) below the measurement (harness/measure/) below the
`make submission` chain (harness/submission.py), which alone drives compliance's packager and
checker; no module of ours imports itself back through others. Every .py under those packages is
parsed, imports at any depth (inside functions too), `from x import`, and relative imports resolved
against the file's package."""

import ast
import sys
from pathlib import Path

from systems.schema import REPO

# package -> the packages of ours it may import (besides itself)
ALLOWED = {
    "kernels": set(),
    "sut": {"kernels", "systems"},  # systems: where $SAAF_CACHE points (schema.saaf_cache), nothing else
    "systems": set(),
    "accuracy": {"systems"},
    "compliance": {"accuracy", "systems"},
    "harness": {"sut", "accuracy", "compliance", "systems"},
}
# sut/'s layers, lowest first: a file may import its own layer and those below. The request types
# at the root; the public API (sut/__init__.py) above the engine; tools and benchmarks on top.
SUT_LAYERS = [
    (
        "types",
        [
            "sut/clock.py",
            "sut/errors.py",
            "sut/sampling_params.py",
            "sut/sequence.py",
            "sut/outputs.py",
            "sut/batch.py",
        ],
    ),
    ("config", ["sut/config"]),
    ("parallel", ["sut/parallel"]),
    ("model", ["sut/model"]),
    ("cpu", ["sut/cpu"]),
    ("sample", ["sut/sample"]),
    ("worker", ["sut/worker"]),
    ("spec_decode", ["sut/spec_decode"]),
    ("engine", ["sut/engine"]),
    ("api", ["sut/__init__.py"]),
    ("tools", ["sut/tools", "sut/bench"]),
]
# harness/'s jobs, lowest first, each file in the layer of its longest path below: the LoadGen run
# (every file at harness/'s top that is not named below), the prediction that simulates them, the
# measurement that drives and reads the runs (and asks the prediction first), the chain that drives
# both and then packages and checks. The runs know nothing of how they are predicted or measured;
# the prediction nothing of the measurement; the measurement nothing of the chain.
HARNESS_LAYERS = [
    ("run", ["harness"]),
    ("predict", ["harness/predict"]),
    ("measure", ["harness/measure"]),
    ("chain", ["harness/submission.py"]),
]
OURS = set(ALLOWED) | {"tests"}
# The engine never drives LoadGen; systems is read by everyone, so it needs nothing installed.
FORBIDDEN_THIRD_PARTY = {"sut": {"mlperf_loadgen"}}
STDLIB_ONLY = {"systems"}


def imported_modules(tree: ast.AST, package_parts: list[str]):
    """(line, dotted module name, names it imports from the module) of every import in `tree`;
    `package_parts`: the file's package, against which relative imports are resolved."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, ()
        elif isinstance(node, ast.ImportFrom):
            names = tuple(alias.name for alias in node.names)
            if node.level:
                base = package_parts[: len(package_parts) - node.level + 1]
                yield node.lineno, ".".join(base + ([node.module] if node.module else [])), names
            else:
                yield node.lineno, node.module, names


def forbidden_imports(root: Path) -> list[str]:
    """'file:line: a -> b' for every import under `root`'s packages that ALLOWED forbids."""
    found = []
    for package, allowed in ALLOWED.items():
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            package_parts = parts if parts[-1] == "__init__" else parts[:-1]
            package_parts = [p for p in package_parts if p != "__init__"]
            for line, module, _ in imported_modules(ast.parse(path.read_text(), str(path)), package_parts):
                top = module.split(".")[0]
                ours_forbidden = top in OURS and top != package and top not in allowed
                third_party_forbidden = top not in OURS and (
                    top in FORBIDDEN_THIRD_PARTY.get(package, ())
                    or (package in STDLIB_ONLY and top not in sys.stdlib_module_names)
                )
                if ours_forbidden or third_party_forbidden:
                    found.append(f"{path.relative_to(root)}:{line}: {package} -> {top} ({module})")
    return found


def layer_of(relative: str, layers=SUT_LAYERS) -> int:
    """The index in `layers` of file `relative` (a path under the repository): the layer of its longest
    member that is the file or a folder above it."""
    found = [
        (len(m), index)
        for index, (_, members) in enumerate(layers)
        for m in members
        if relative == m or relative.startswith(m + "/")
    ]
    if not found:
        raise AssertionError(f"{relative} is in none of the layers: give it a layer")
    return max(found)[1]


def module_file(root: Path, module: str) -> Path | None:
    """The file of our module `module` (a package's __init__.py), or None when it is not a module of ours
    (a name imported from a package: `from sut.config import EngineConfig` names sut/config/__init__.py)."""
    base = root.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def our_imports(root: Path, packages) -> dict[str, set[str]]:
    """Each .py file of `packages` (relative path) -> the files of ours it imports (relative paths)."""
    graph = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            package_parts = [p for p in (parts if parts[-1] == "__init__" else parts[:-1]) if p != "__init__"]
            targets = set()
            modules = []
            for _, module, names in imported_modules(ast.parse(path.read_text(), str(path)), package_parts):
                # `from package import name` imports the submodule package/name.py where there is one.
                modules += [module, *(f"{module}.{name}" for name in names)]
            for module in modules:
                if module.split(".")[0] in OURS and (target := module_file(root, module)) is not None:
                    targets.add(target.relative_to(root).as_posix())
            graph[path.relative_to(root).as_posix()] = targets - {path.relative_to(root).as_posix()}
    return graph


def layer_violations(root: Path, package: str = "sut", layers=SUT_LAYERS) -> list[str]:
    """'a -> b (layer x above y)' for every file of `package` that imports a layer above its own."""
    found = []
    for source, targets in our_imports(root, [package]).items():
        for target in sorted(t for t in targets if t.startswith(package + "/")):
            if layer_of(target, layers) > layer_of(source, layers):
                found.append(
                    f"{source} -> {target} ({layers[layer_of(source, layers)][0]} imports "
                    f"{layers[layer_of(target, layers)][0]}, a layer above it)"
                )
    return found


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one file (Tarjan's algorithm), each sorted."""
    index, low, stack, on_stack, cycles, counter = {}, {}, [], set(), [], [0]

    def visit(node):
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def test_imports_run_one_way():
    assert forbidden_imports(REPO) == []


def test_sut_layers_import_only_below():
    assert layer_violations(REPO) == []


def test_harness_jobs_import_only_below():
    """The run below the measurement below the chain: harness/'s top imports neither harness/measure/
    nor harness/submission.py, harness/measure/ not the chain."""
    assert layer_violations(REPO, "harness", HARNESS_LAYERS) == []


def test_only_the_chain_drives_the_packager_and_the_checker():
    """compliance's packager and checker are the chain's to call (harness/submission.py), not the
    run's or the measurement's, which read run folders and logs only."""
    callers = set()
    for path in (REPO / "harness").rglob("*.py"):
        for _, module, names in imported_modules(ast.parse(path.read_text()), []):
            modules = {module, *(f"{module}.{name}" for name in names)}
            if modules & {"compliance.package", "compliance.check"}:
                callers.add(path.relative_to(REPO).as_posix())
    assert callers == {"harness/submission.py"}


def test_no_import_cycle_anywhere():
    assert import_cycles(our_imports(REPO, sorted(OURS))) == []


def test_no_benchmarks_accuracy_script_imports_anothers():
    """A benchmark's own accuracy script (accuracy/<scorer>.py: gpt_oss.py, deepseek_r1.py) takes what it
    shares with another, the code sandbox and the accuracy-log readers, from modules of their own."""
    from systems.benchmarks import BENCHMARKS

    graph = our_imports(REPO, ["accuracy"])
    scripts = {f"accuracy/{b.scorer}.py" for b in BENCHMARKS.values()} & set(graph)
    assert scripts >= {"accuracy/gpt_oss.py", "accuracy/deepseek_r1.py"}
    assert {script: graph[script] & scripts for script in scripts} == dict.fromkeys(scripts, set())


def test_the_cycle_and_layer_checks_catch_what_they_look_for(tmp_path):
    (tmp_path / "sut" / "engine").mkdir(parents=True)
    (tmp_path / "sut" / "model").mkdir()
    for name in ("sut/__init__.py", "sut/engine/__init__.py", "sut/model/__init__.py"):
        (tmp_path / name).write_text("")
    (tmp_path / "sut" / "errors.py").write_text("")
    (tmp_path / "sut" / "model" / "llama.py").write_text(
        "from sut.errors import X\n\n\ndef f():\n    import sut.engine.a\n"
    )
    (tmp_path / "sut" / "engine" / "a.py").write_text("from sut.model import llama\nfrom . import b\n")
    (tmp_path / "sut" / "engine" / "b.py").write_text("from sut.engine.a import A\n")
    assert layer_violations(tmp_path) == [
        "sut/model/llama.py -> sut/engine/a.py (model imports engine, a layer above it)"
    ]
    assert import_cycles(our_imports(tmp_path, ["sut"])) == [
        ["sut/engine/a.py", "sut/engine/b.py", "sut/model/llama.py"]
    ]
    (tmp_path / "harness" / "measure").mkdir(parents=True)
    for name in ("harness/__init__.py", "harness/measure/__init__.py", "harness/measure/report.py"):
        (tmp_path / name).write_text("")
    (tmp_path / "harness" / "config.py").write_text("")
    (tmp_path / "harness" / "run.py").write_text("from harness.config import X\nfrom harness.measure import report\n")
    (tmp_path / "harness" / "measure" / "capacity.py").write_text(
        "from harness import config\nfrom .report import R\n\n\ndef f():\n    from harness import submission\n"
    )
    (tmp_path / "harness" / "submission.py").write_text("import harness.run\nfrom harness.measure import capacity\n")
    assert layer_violations(tmp_path, "harness", HARNESS_LAYERS) == [
        "harness/measure/capacity.py -> harness/submission.py (measure imports chain, a layer above it)",
        "harness/run.py -> harness/measure/__init__.py (run imports measure, a layer above it)",
        "harness/run.py -> harness/measure/report.py (run imports measure, a layer above it)",
    ]


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


def test_sut_takes_from_systems_only_where_the_cache_is():
    """The engine knows nothing of MLPerf systems; it shares the one place $SAAF_CACHE is resolved."""
    taken = set()
    for path in (REPO / "sut").rglob("*.py"):
        for _, module, names in imported_modules(ast.parse(path.read_text()), []):
            if module and module.split(".")[0] == "systems":
                taken |= {(module, name) for name in names} or {(module, None)}
    assert taken == {("systems.schema", "saaf_cache")}
