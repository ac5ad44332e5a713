"""The package's layout: layers that point one way, no import cycles.

That every exported name is documented is tests/test_docs_api.py's check.

The import graph is read from the source (every ``import`` statement wherever
it stands, inside functions too: a deferred import that only hides a cycle is
still a cycle), not from what happens to be imported at run time.

Each layer (a subpackage, or a module at the package's top) has a rank in
:data:`LAYER_RANKS`; a module may import its own layer and layers of lower
rank only, so the layer-to-layer graph is acyclic, not only the module graph.
Check it with ``python -m pytest tests/test_package_layout.py -q``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import jax_sparse_sync as jss

PACKAGE = Path(jss.__file__).parent
ROOT = "jax_sparse_sync"
#: The compiled nanobind modules (no Python source; they import nothing of ours).
EXTENSIONS = ("jax_sparse_sync._jss_cpu", "jax_sparse_sync._jss_cuda")

#: Each layer's rank: a module imports its own layer and lower ranks only. Layers
#: of equal rank import nothing of each other. ``""`` is the package's
#: ``__init__.py``, the public API on top of everything.
LAYER_RANKS = {
    "base": 0,            # argument checks, JAX-compatibility helpers: imports nothing of ours
    "_ext": 1,            # loads the compiled FFI modules, registers their targets
    "host_allocator": 1,  # glibc malloc tuning (ctypes)
    "model": 2,           # the pure cost model, algorithm choice and grouping planner
    "stats": 2,           # the SyncStats layout shared by both transports
    "bindings": 3,        # every ffi_call: the FFI kernels as JAX functions, per device, no communication
    "mesh": 4,            # the mesh-axis transport (JAX collectives)
    "_moved": 1,          # old module paths (kernels, axis) aliased for one release (importlib)
    "mpi": 4,             # the MPI transport (ordered FFI primitives)
    "ops": 5,             # the collective ops; ops/transport.py picks the transport
    "transforms": 6,      # the Optax transforms
    "planning": 7,        # calibration and profiling, which run the transforms
    "": 8,                # jax_sparse_sync/__init__.py
}
#: Public namespaces (``jss.mpi``, ``jss.planning``): their ``__init__`` re-exports
#: names; every other subpackage's ``__init__`` only holds a docstring.
NAMESPACES = ("jax_sparse_sync.mpi", "jax_sparse_sync.planning")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(path: Path, name: str, modules: dict[str, Path]) -> set[str]:
    """Package modules imported anywhere in ``path`` (``from a import b`` -> ``a.b`` when
    ``b`` is a module, else ``a``)."""
    is_pkg = path.name == "__init__.py"
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import
                anchor = name.split(".") if is_pkg else name.split(".")[:-1]
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules
                       or f"{base}.{a.name}" in EXTENSIONS else base for a in node.names]
        else:
            continue
        out.update(t for t in targets if t == ROOT or t.startswith(ROOT + "."))
    return {t for t in out if t in modules}


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(path, name, modules) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a list of modules (first == last), or None."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def layer(module: str) -> str:
    """``jax_sparse_sync.ops.transport`` -> ``ops``; ``jax_sparse_sync.stats`` -> ``stats``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a layer of equal or higher rank than the importer's own."""
    return [f"{name} ({layer(name) or ROOT}, rank {LAYER_RANKS[layer(name)]}) imports {dep} "
            f"({layer(dep) or ROOT}, rank {LAYER_RANKS[layer(dep)]})"
            for name, deps in sorted(graph.items()) for dep in sorted(deps)
            if layer(dep) != layer(name) and LAYER_RANKS[layer(dep)] >= LAYER_RANKS[layer(name)]]


def test_every_module_belongs_to_a_ranked_layer():
    unranked = sorted(name for name in _modules() if layer(name) not in LAYER_RANKS)
    assert not unranked, (f"give these a layer rank in LAYER_RANKS (tests/test_package_layout.py): "
                          f"{unranked}")


def test_imports_point_down():
    bad = upward_imports(import_graph())
    assert not bad, "imports that point up or sideways:\n" + "\n".join(bad)


def test_layer_graph_has_no_cycle():
    layers: dict[str, set[str]] = {}
    for name, deps in import_graph().items():
        layers.setdefault(layer(name), set()).update(layer(d) for d in deps if layer(d) != layer(name))
    cycle = find_cycle(layers)
    assert cycle is None, "layer cycle: " + " -> ".join(cycle)


def test_layer_checker_sees_deferred_upward_imports(tmp_path):
    # A function-level import of the transport from the base layer points up:
    # the checker must see it (and not flag an import within one layer).
    path = tmp_path / "probe.py"
    path.write_text("from jax_sparse_sync.base import arguments\n"
                    "def f():\n    from jax_sparse_sync.ops import transport\n    return transport\n")
    graph = import_graph()
    graph["jax_sparse_sync.base.probe"] = _imports(path, "jax_sparse_sync.base.probe", _modules())
    assert upward_imports(graph) == [
        "jax_sparse_sync.base.probe (base, rank 0) imports jax_sparse_sync.ops.transport "
        "(ops, rank 5)"]
    # Layers of equal rank may not import each other either.
    graph = import_graph()
    graph["jax_sparse_sync.mesh.comm"] = graph["jax_sparse_sync.mesh.comm"] | {
        "jax_sparse_sync.mpi.comm"}
    assert len(upward_imports(graph)) == 1


def test_import_graph_has_no_cycle():
    graph = import_graph()
    assert len(graph) > 30 and "jax_sparse_sync.ops.transport" in graph
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_cycle_finder_sees_deferred_imports(tmp_path):
    # The checker must count an import inside a function body (the old
    # axis.py <-> sparse_allreduce.py cycle was hidden that way).
    src = "def f():\n    from jax_sparse_sync.ops import transport\n    return transport\n"
    path = tmp_path / "probe.py"
    path.write_text(src)
    modules = _modules()
    deps = _imports(path, "jax_sparse_sync.mesh.probe", modules)
    assert deps == {"jax_sparse_sync.ops.transport"}
    graph = import_graph()
    graph["jax_sparse_sync.mesh.comm"] = graph["jax_sparse_sync.mesh.comm"] | {
        "jax_sparse_sync.ops.transport"}
    cycle = find_cycle(graph)
    assert cycle is not None and "jax_sparse_sync.ops.transport" in cycle


def test_subpackage_inits_import_nothing():
    # Importing jax_sparse_sync.base.arguments runs base/__init__.py first: if it
    # imported its siblings, a transport importing one op module would pull in all.
    # The public namespaces re-export (their imports are ranked like any other).
    for path in PACKAGE.glob("*/__init__.py"):
        if _module_name(path) in NAMESPACES:
            continue
        tree = ast.parse(path.read_text())
        imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
        assert not imports, f"{path.relative_to(PACKAGE.parent)} should only hold a docstring"


def test_transports_are_chosen_in_one_place():
    # Only ops/transport.py imports the transports' implementations; the ops
    # and transforms reach them through it. The non-blocking calls exist on MPI
    # only (no choice to make), so they bind the MPI primitives themselves.
    graph = import_graph()
    for name, deps in graph.items():
        if name in ("jax_sparse_sync.ops.transport", "jax_sparse_sync.ops.nonblocking"):
            continue
        if name.startswith(
                ("jax_sparse_sync.mesh.", "jax_sparse_sync.mpi.")):
            continue
        implementations = {d for d in deps if re.match(
            r"jax_sparse_sync\.(axis\.(sparse_allreduce|oktopk|block|dense)|mpi\.(sparse_allreduce|"
            r"oktopk|block|dense_allreduce))$", d)}
        assert not implementations, f"{name} imports {implementations} directly"


def _private_names_imported(modules: dict[str, Path]) -> list[str]:
    """``from <our module> import _name`` where ``_name`` is not itself a module."""
    found = []
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.module
                    and node.module.startswith(ROOT)):
                continue
            for alias in node.names:
                private = alias.name.startswith("_") and not alias.name.startswith("__")
                if private and f"{node.module}.{alias.name}" not in modules \
                        and f"{node.module}.{alias.name}" not in EXTENSIONS:
                    found.append(f"{name} imports {node.module}.{alias.name}")
    return found


def test_no_module_imports_another_modules_private_names():
    assert _private_names_imported(_modules()) == []


def test_private_import_checker_sees_one(tmp_path):
    package = tmp_path / ROOT
    package.mkdir()
    (package / "a.py").write_text("def _helper():\n    return 1\n")
    (package / "b.py").write_text(f"from {ROOT}.a import _helper\n")
    modules = {f"{ROOT}.a": package / "a.py", f"{ROOT}.b": package / "b.py"}
    assert _private_names_imported(modules) == [f"{ROOT}.b imports {ROOT}.a._helper"]


def test_every_ffi_call_is_in_the_binding_layer():
    """One home per concern: the FFI kernels become JAX functions in ``bindings/`` only
    (the MPI primitives' lowering, with its ordered effect, is ``mpi/primitive.py``'s)."""
    outside = [name for name, path in _modules().items()
               if "ffi_call(" in path.read_text() and not name.startswith(f"{ROOT}.bindings")]
    assert outside == []
