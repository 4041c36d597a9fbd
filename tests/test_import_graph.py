"""Imports go one way: no module of marl_runner or connectors imports itself back in a
cycle, and none imports from a higher layer (the layers of docs/DESIGN.md)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("marl_runner", "connectors")


def project_modules() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            modules[name.removesuffix(".__init__")] = path
    return modules


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """``module -> project modules it imports`` (at any depth of the file: lazy imports count)."""
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            else:
                continue
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles() -> None:
    assert cycles(import_graph(project_modules())) == []


#: The layers, bottom first (docs/DESIGN.md, "Layers"). A module belongs to the layer of
#: the longest entry that names it or a package above it; a module may import from its
#: own layer and the ones below, never from one above.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "foundation",
        (
            "marl_runner.batch",
            "marl_runner.checks",
            "marl_runner.metrics",
            "marl_runner.metrics_merge",
            "marl_runner.callbacks",
            "marl_runner.ray_support",
            "marl_runner.safe_files",
        ),
    ),
    ("connectors", ("connectors",)),
    ("envs and policies", ("marl_runner.envs", "marl_runner.policy")),
    ("config", ("marl_runner.config", "marl_runner.mapping", "marl_runner.policy_setup")),
    (
        "files and run output",
        (
            "marl_runner.io",
            "marl_runner.metrics_log",
            "marl_runner.tensorboard",
            "marl_runner.progress",
        ),
    ),
    ("sampling", ("marl_runner.sampling",)),
    # saving, restoring and evaluating runners; the file format itself is io.array_tree
    ("checkpoints", ("marl_runner.checkpoint",)),
    ("runner groups", ("marl_runner.distributed",)),
    ("serving", ("marl_runner.serving", "marl_runner.client")),
    ("commands", ("marl_runner.cli", "marl_runner.bench")),
    ("public names", ("marl_runner",)),
)

def layer_of(module: str, layers=LAYERS) -> int:
    """The index of the layer whose longest entry is `module` or a package above it."""
    best = None
    for index, (_, entries) in enumerate(layers):
        for entry in entries:
            if module == entry or module.startswith(entry + "."):
                if best is None or len(entry) > best[0]:
                    best = (len(entry), index)
    assert best is not None, f"{module} is in no layer: add it to LAYERS and docs/DESIGN.md"
    return best[1]


def upward_imports(graph: dict[str, set[str]], layers=LAYERS) -> set[tuple[str, str]]:
    return {
        (module, target)
        for module, targets in graph.items()
        for target in targets
        if layer_of(target, layers) > layer_of(module, layers)
    }


def test_the_layer_check_finds_an_upward_import() -> None:
    layers = (("low", ("p.low",)), ("high", ("p.high", "p")))
    graph = {"p.low.a": {"p.high.b"}, "p.high.b": {"p.low.a"}, "p.low.c": {"p"}}
    assert upward_imports(graph, layers) == {("p.low.a", "p.high.b"), ("p.low.c", "p")}


def test_no_import_runs_up_the_layers() -> None:
    found = upward_imports(import_graph(project_modules()))
    assert found == set(), "imports from a higher layer (see docs/DESIGN.md)"
