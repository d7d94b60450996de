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
LAYERS = (
    "core",
    "data",
    "deployment",
    "privacy",
    "toolkit",
    "capabilities",
    "results",
    "engine",
    "suite",
    "api",
    "commands",
)


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


#: the modules where raysim may use Ray's and PyTorch's private internals: each use there gives its
#: reason, the version it was checked on and its public fallback, behind the one switch
#: RAYSIM_INTERNALS (raysim/internals.py)
INTERNALS = {"raysim.engine.executors.ray_internals", "raysim.torch_internals"}
#: private uses not yet moved behind that door, with what they are
NOT_YET: dict[str, str] = {}
#: attributes of Ray's and PyTorch's objects that are theirs alone (a module's state dicts, Ray's node)
PRIVATE_ATTRIBUTES = frozenset(
    {
        "_parameters", "_buffers", "_modules", "_non_persistent_buffers_set", "_state_dict_hooks",
        "_state_dict_pre_hooks", "_save_to_state_dict", "_load_from_state_dict", "_apply",
        "_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_global_node", "_ray_params",
        "_session_dir", "_node_id", "_get_unused_port", "_webui_url", "_initialize_global_state",
        "_get_gcs_client_options", "all_processes", "kill_all_processes",
    }
)  # fmt: skip


def _private(name: str) -> bool:
    return name.startswith("_") and not name.endswith("__")


def private_uses(path: Path) -> list[str]:
    """The private Ray and PyTorch names ``path`` uses: imports of a private module of theirs (or of
    Ray's generated protocol), attributes of ``ray`` or ``torch`` with a private part, the private
    attributes of their objects (:data:`PRIVATE_ATTRIBUTES`), and Ray's undocumented settings
    (``RAY_`` then a lower-case name) and private loggers named in strings."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Attribute):
            chain = [node.attr]
            value = node.value
            while isinstance(value, ast.Attribute):
                chain.append(value.attr)
                value = value.value
            if isinstance(value, ast.Name):
                names = [".".join([value.id, *reversed(chain)])]
            if node.attr in PRIVATE_ATTRIBUTES and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                out.append(f"{path.name}:{node.lineno}: .{node.attr}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
            if (text.startswith("RAY_") and text[4:5].islower()) or text.startswith("ray._private"):
                out.append(f"{path.name}:{node.lineno}: {text!r}")
        for name in names:
            parts = name.split(".")
            if parts[0] in ("ray", "torch", "nn") and (any(_private(p) for p in parts) or name.startswith("ray.core.generated")):
                out.append(f"{path.name}:{node.lineno}: {name}")
    return sorted(set(out))


def test_only_the_internals_modules_use_ray_and_pytorch_internals():
    """Every use of a private Ray or PyTorch API is in one of :data:`INTERNALS` (or listed in
    :data:`NOT_YET`), where it has its reason, version and fallback and the switch turns it off."""
    found = {name: private_uses(path) for name, path in modules().items() if name not in INTERNALS}
    assert {name: uses for name, uses in found.items() if uses and name not in NOT_YET} == {}
    assert all(found[name] for name in NOT_YET), "moved behind the door: drop it from NOT_YET"
    assert all(private_uses(modules()[name]) for name in INTERNALS)  # the check sees what they use


def test_a_private_use_is_found(tmp_path):
    code = (
        "import torch\nfrom ray._private import services\nfrom ray.core.generated import common_pb2\n"
        "torch._foreach_copy_(a, b)\nm._parameters\nos.environ['RAY_worker_niceness'] = '0'\n"
        "self._parameters\ntorch.nn.Linear\n"
    )
    (tmp_path / "m.py").write_text(code)
    assert {u.split(": ", 1)[1] for u in private_uses(tmp_path / "m.py")} == {
        "ray._private", "ray._private.services", "ray.core.generated", "ray.core.generated.common_pb2",
        "torch._foreach_copy_", "._parameters", "'RAY_worker_niceness'",
    }  # fmt: skip
