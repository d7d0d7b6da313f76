"""The imports follow the data: traces → ingest → tables → fit / devices → simulate → validate → report, and no
module imports one that (directly or not) imports it back. A stage imports the stages before it; the tables sit
below the sources that write them (ingest and the importers use their schemas), the workload and device models
below the simulator, and the reports below the workflows and the command line that write them.

Walks every module of vtrain/ with ``ast`` (imports inside functions included; those under ``if TYPE_CHECKING:``
are annotations and left out) and checks each import against :data:`LAYERS`, the allowed order, lowest first. A
module belongs to the layer of the longest prefix that names it. It may import a module of a lower layer, or of
its own layer when both are in one package (``vtrain.fit.device`` → ``vtrain.fit.alpha_beta``) or the layer is
the foundation (shared vocabularies and plumbing, which import only each other). Everything else is an import
against the flow.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO

#: the allowed order of imports, lowest first (a module imports lower layers, and its own layer within its
#: package or in the foundation)
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("foundation: shared vocabularies and plumbing", (
        "vtrain", "vtrain.errors", "vtrain.limits", "vtrain.configfile", "vtrain.runconfig", "vtrain.parallel",
        "vtrain.naming", "vtrain.kineto", "vtrain.outputs", "vtrain.collective_cost", "vtrain.distributed",
        "vtrain.flops", "vtrain.cache", "vtrain.partition", "vtrain.architectures", "vtrain.accuracy")),
    ("tables: schemas, store, latency tables", ("vtrain.tables",)),
    ("sources: recording, ingesting traces, importing benchmarks", ("vtrain.record", "vtrain.ingest",
                                                                     "vtrain.importers")),
    ("replay of traces", ("vtrain.replay",)),
    ("workload: the model's operators and the graph of a run", ("vtrain.model", "vtrain.graph")),
    ("devices: datasheet and fitted device models", ("vtrain.devices",)),
    ("fit: device models fitted to tables", ("vtrain.fit",)),
    ("what a run argument names: a run config, a model, a Megatron log on the profile's GPU", (
        "vtrain.run_argument",)),
    ("simulate", ("vtrain.simulate",)),
    ("fit through the simulator: host overheads, the `vtrain fit` build", (
        "vtrain.fit.iterations", "vtrain.fit.traced_host", "vtrain.fit.build")),
    ("validate: predictions against measurements; calibration's drift", (
        "vtrain.validate", "vtrain.calibrate.drift", "vtrain.calibrate.result", "vtrain.calibrate.profile")),
    ("report", ("vtrain.report",)),
    ("workflows: calibrate, what-if, plan", ("vtrain.calibrate", "vtrain.whatif", "vtrain.plan")),
    ("studies built on the planner", ("vtrain.studies",)),
    ("command line", ("vtrain.cli",)),
]

#: imports against the flow that remain, each with why; the test fails when one goes away (so the list shrinks)
KNOWN: dict[tuple[str, str], str] = {}

PACKAGE = REPO / "vtrain"


def module_name(path: Path, root: Path) -> str:
    """``vtrain.fit.device`` for ``vtrain/fit/device.py`` (a package's ``__init__`` is the package)."""
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(root: Path) -> dict[str, Path]:
    """Every module under ``root`` by its dotted name."""
    return {module_name(path, root): path for path in sorted(root.rglob("*.py"))}


def imports(path: Path, known: dict[str, Path], name: str) -> Iterator[tuple[str, int, bool]]:
    """``(imported module, line, at import time)`` for every import of a module of the package in ``path``
    (``from a.b import c`` imports ``a.b.c`` when that is a module, else ``a.b``; relative imports are resolved);
    imports under ``if TYPE_CHECKING:`` are left out."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    top = root_package(name)
    here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node, at_import in _walk(tree.body, at_import=True):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join([*here[:len(here) - node.level + 1], *([node.module] if node.module else [])]
                            ) if node.level else node.module or ""
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for target in targets:
            if root_package(target) == top:
                yield target, node.lineno, at_import


def _walk(body: list[ast.stmt], at_import: bool) -> Iterator[tuple[ast.AST, bool]]:
    for node in body:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from _walk(node.orelse, at_import)
            continue
        yield node, at_import
        inside = at_import and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for field in ("body", "orelse", "finalbody", "handlers"):
            children = getattr(node, field, None)
            if isinstance(children, list):
                yield from _walk([c for c in children if isinstance(c, (ast.stmt, ast.ExceptHandler))], inside)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def root_package(name: str) -> str:
    return name.split(".")[0]


def package(name: str) -> str:
    """The top-level subpackage or module: ``vtrain.fit`` for ``vtrain.fit.device``."""
    return ".".join(name.split(".")[:2])


def layer(name: str, layers: list[tuple[str, tuple[str, ...]]] = LAYERS) -> int:
    """Index of the layer of the longest prefix naming ``name``."""
    best, best_length = -1, -1
    for index, (_, prefixes) in enumerate(layers):
        for prefix in prefixes:
            if (name == prefix or name.startswith(prefix + ".")) and len(prefix) > best_length:
                best, best_length = index, len(prefix)
    if best < 0:
        raise AssertionError(f"{name} is in no layer of the allowed order: add it to LAYERS")
    return best


def against_the_flow(root: Path, layers: list[tuple[str, tuple[str, ...]]] = LAYERS) -> dict[tuple[str, str], str]:
    """Every import of a module under ``root`` that the order ``layers`` does not allow, with where it is."""
    found = modules(root)
    bad: dict[tuple[str, str], str] = {}
    for name, path in found.items():
        for target, line, _ in imports(path, found, name):
            mine, theirs = layer(name, layers), layer(target, layers)
            allowed = theirs < mine or (theirs == mine and (mine == 0 or package(name) == package(target)))
            if not allowed:
                bad[(name, target)] = (f"{path.relative_to(root.parent)}:{line}: {name} ({layers[mine][0]}) "
                                       f"imports {target} ({layers[theirs][0]})")
    return bad


def import_cycles(root: Path) -> list[list[str]]:
    """Cycles among the imports made at import time (module level, not inside functions), each as a list."""
    found = modules(root)
    graph = {name: sorted({t for t, _, at_import in imports(path, found, name) if at_import and t != name})
             for name, path in found.items()}
    cycles, state = [], dict.fromkeys(graph, 0)  # 0 unseen, 1 on the path, 2 done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in graph.get(node, ()):
            if state.get(nxt) == 1:
                cycles.append(path[path.index(nxt):] + [nxt])
            elif state.get(nxt) == 0:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for name in graph:
        if state[name] == 0:
            visit(name, [name])
    return cycles


def test_no_import_runs_against_the_flow() -> None:
    bad = against_the_flow(PACKAGE)
    unexpected = {key: where for key, where in bad.items() if key not in KNOWN}
    assert not unexpected, "imports against the flow:\n" + "\n".join(unexpected.values())
    gone = set(KNOWN) - set(bad)
    assert not gone, f"no longer imported, remove from KNOWN: {sorted(gone)}"


def test_no_import_cycle() -> None:
    assert import_cycles(PACKAGE) == []


def test_the_named_imports_against_the_flow_are_gone() -> None:
    """The ones issue 16 named: tables/ read the kernel classes from ingest/, the fitted device imported fit/."""
    bad = against_the_flow(PACKAGE)
    assert not [key for key in bad if key[0].startswith(("vtrain.tables", "vtrain.devices"))]
    assert not [key for key in bad if package(key[0]) == "vtrain.calibrate" and package(key[1]) == "vtrain.report"
                and key[0] != "vtrain.calibrate.calibration"]


def test_every_module_has_a_layer() -> None:
    for name in modules(PACKAGE):
        layer(name)


def test_the_checks_catch_a_backward_import_and_a_cycle(tmp_path: Path) -> None:
    """A made-up package: ``low`` imports ``high`` (against the order), ``a`` and ``b`` import each other at import
    time; an import inside a function or under TYPE_CHECKING is no cycle, and the latter no dependency."""
    root = tmp_path / "pkg"
    (root / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "",
        "low.py": "from pkg.high import thing\n",
        "high.py": "thing = 1\n",
        "a.py": "import pkg.b\n",
        "b.py": "from pkg import a\n",
        "lazy.py": "def f():\n    from pkg import late\n",
        "sub/__init__.py": "",
        "sub/deep.py": "from ..high import thing\nfrom . import other\n",
        "sub/other.py": "",
        "late.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import top\nimport pkg.lazy\n",
        "top.py": "",
    }
    for name, text in files.items():
        (root / name).write_text(text)
    layers = [("base", ("pkg", "pkg.a", "pkg.b", "pkg.lazy", "pkg.late")), ("low", ("pkg.low", "pkg.sub")),
              ("high", ("pkg.high", "pkg.top"))]
    assert set(against_the_flow(root, layers)) == {("pkg.low", "pkg.high"), ("pkg.sub.deep", "pkg.high")}
    assert [sorted(c) for c in import_cycles(root)] == [sorted(["pkg.a", "pkg.b", "pkg.a"])]


@pytest.mark.parametrize("name", ["vtrain.fit.device", "vtrain.fit.iterations", "vtrain.calibrate.calibration",
                                  "vtrain.calibrate.drift"])
def test_longest_prefix_wins(name: str) -> None:
    expected = {"vtrain.fit.device": "fit: device models fitted to tables",
                "vtrain.fit.iterations": "fit through the simulator: host overheads, the `vtrain fit` build",
                "vtrain.calibrate.calibration": "workflows: calibrate, what-if, plan",
                "vtrain.calibrate.drift": "validate: predictions against measurements; calibration's drift"}
    assert LAYERS[layer(name)][0] == expected[name]
