"""The shape of the dependencies (docs/design.md): ``algorithms/`` depends on ``raysim/``, never the
reverse, and there is no import cycle between or inside the two packages. Read statically from the
source: every import counts, also those inside functions and under ``TYPE_CHECKING``, since those
are the ones that hide a cycle."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("raysim", "algorithms")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules ``name`` imports: ``from a.b import c`` is ``a.b.c`` when that is a
    module, else ``a.b``; relative imports are resolved against the package."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:  # ``import a.b.c`` of a module inside the project
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports_of(name, path, set(mods)) for name, path in mods.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_the_graph_is_read():
    g = graph()
    assert "raysim.engine.runner" in g and "algorithms.fedavg" in g
    assert "raysim.config" in g["raysim.engine.runner"]  # a plain import is seen
    assert any(m.startswith("raysim") for m in g["algorithms.fedavg"])


def test_the_engine_never_imports_the_algorithms():
    offenders = {
        m: sorted(t for t in deps if t.split(".")[0] == "algorithms")
        for m, deps in graph().items()
        if m.split(".")[0] == "raysim"
    }
    assert {m: t for m, t in offenders.items() if t} == {}


def test_no_import_cycle():
    assert cycles(graph()) == []


def test_a_cycle_is_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_imports_anothers_private_names():
    """What a module keeps to itself (``_name``) stays there: one that another needs is public."""
    offenders = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in PACKAGES:
                offenders += [f"{name}: {node.module}.{a.name}" for a in node.names if a.name.startswith("_") and not a.name.endswith("__")]
    assert offenders == []


#: raysim's packages from the bottom up: a module imports only from its own layer or those below.
#: "core" is raysim's top-level modules (config, registry, wire, weights, records, ...); "api" is
#: raysim/api.py, the Python API under the commands.
LAYERS = ("core", "data", "deployment", "toolkit", "capabilities", "results", "engine", "suite", "api", "commands")


def layer_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:  # raysim/__init__.py: its exports load lazily, by name, never imported
        return "core"
    if parts[1] in LAYERS:
        return parts[1]
    return "core"


def test_the_packages_import_downwards_only():
    rank = {name: i for i, name in enumerate(LAYERS)}
    upward = sorted(
        f"{m} -> {d}"
        for m, deps in graph().items()
        if m.split(".")[0] == "raysim"
        for d in deps
        if d.split(".")[0] == "raysim" and rank[layer_of(d)] > rank[layer_of(m)]
    )
    assert upward == []


def test_the_layers_are_raysims_packages():
    packages = {p.parent.name for p in (ROOT / "raysim").glob("*/__init__.py")}
    assert packages == set(LAYERS) - {"core", "api"}
    assert layer_of("raysim.engine.executors.schedule") == "engine" and layer_of("raysim.config") == "core"
