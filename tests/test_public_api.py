"""The public namespace: sorted ``__all__`` lists that resolve, deprecated aliases that warn."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import tomllib
import warnings
from pathlib import Path

import pytest

import jax_sparse_sync as jss

ROOT = Path(jss.__file__).parent.parent
NAMESPACES = [jss, jss.mpi, jss.planning]
#: Deprecated top-level name -> the object it must still return.
MOVED = {
    "BackwardProfile": lambda: jss.planning.BackwardProfile,
    "GROUPINGS": lambda: jss.planning.GROUPINGS,
    "GroupingPlan": lambda: jss.planning.GroupingPlan,
    "TimelineRecord": lambda: jss.planning.TimelineRecord,
    "calibrate": lambda: jss.planning.calibrate,
    "cost_model": lambda: jss.planning.cost_model,
    "nonblocking_timeline": lambda: jss.planning.nonblocking_timeline,
    "plan_grouping": lambda: jss.planning.plan_grouping,
    "profile_backward": lambda: jss.planning.profile_backward,
    "resolve_algorithm": lambda: jss.planning.resolve_algorithm,
    "resolve_k": lambda: jss.planning.resolve_k,
    "abort_on_error": lambda: jss.mpi.abort_on_error,
    "default_comm": lambda: jss.mpi.default_comm,
    "reset_after_mpi_error": lambda: jss.mpi.reset_after_mpi_error,
    "tune_host_allocator": lambda: jss.mpi.tune_host_allocator,
    "AxisComm": lambda: importlib.import_module("jax_sparse_sync.mesh.comm").AxisComm,
    "STATS_FIELDS": lambda: jss.SyncStats._fields,
    "block_scan": lambda: importlib.import_module("jax_sparse_sync.bindings.block_scan").block_scan,
    "selection_policy": lambda: importlib.import_module(
        "jax_sparse_sync.transforms.selection_policy"),
}


@pytest.mark.parametrize("namespace", NAMESPACES, ids=lambda m: m.__name__)
def test_all_is_sorted_and_resolves(namespace):
    assert namespace.__all__ == sorted(namespace.__all__)
    assert len(set(namespace.__all__)) == len(namespace.__all__)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        for name in namespace.__all__:
            assert getattr(namespace, name) is not None, f"{namespace.__name__}.{name}"


def test_helpers_are_not_exported():
    for name in MOVED:
        assert name not in jss.__all__


def test_one_way_to_name_a_mesh_axis():
    assert callable(jss.axis) and jss.axis("data") == jss.axis("data")
    assert "AxisComm" not in jss.__all__


@pytest.mark.parametrize("name", sorted(MOVED))
def test_deprecated_alias_warns_and_names_its_replacement(name):
    with pytest.warns(DeprecationWarning, match=rf"jax_sparse_sync\.{name} is deprecated") as rec:
        value = getattr(jss, name)
    assert value is MOVED[name]() or value == MOVED[name]()
    message = str(rec[0].message)
    replacement = jss._DEPRECATED[name][2]
    assert f"use {replacement}" in message
    assert rec[0].filename == __file__  # stacklevel points at the caller


def test_unknown_name_raises_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        jss.not_a_name  # noqa: B018


def test_version_comes_from_the_package_metadata():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert jss.__version__ == pyproject["project"]["version"]
    assert jss.__version__ == importlib.metadata.version("jax_sparse_sync")
    source = (ROOT / "jax_sparse_sync" / "__init__.py").read_text()
    assert not re.search(r"__version__\s*=\s*['\"]\d+\.\d+", source), "write the version in pyproject only"


def _deprecated_uses(path: Path) -> list[str]:
    """``jss.<deprecated name>`` attribute reads in one file."""
    tree = ast.parse(path.read_text(), str(path))
    return [f"{path.relative_to(ROOT)}:{node.lineno}: jss.{node.attr}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and node.attr in jss._DEPRECATED
            and isinstance(node.value, ast.Name) and node.value.id in ("jss", "jax_sparse_sync")]


def test_the_project_uses_no_deprecated_name():
    files = [p for d in ("jax_sparse_sync", "tests", "benchmarks", "examples")
             for p in sorted((ROOT / d).rglob("*.py")) if p.name != "test_public_api.py"]
    uses = [u for p in files for u in _deprecated_uses(p)]
    assert not uses, "use the new names:\n" + "\n".join(uses)


def test_moved_module_paths_warn_and_resolve():
    """jax_sparse_sync.kernels.* / .axis.* (0.1) alias bindings.* / mesh.* for one release,
    and jss.axis stays the function that names a mesh axis after an old-style import."""
    import importlib
    import sys
    for old in [m for m in sys.modules if m.startswith(("jax_sparse_sync.kernels",
                                                        "jax_sparse_sync.axis"))]:
        del sys.modules[old]
    with pytest.warns(DeprecationWarning, match="import jax_sparse_sync.mesh.comm"):
        old_comm = importlib.import_module("jax_sparse_sync.axis.comm")
    with pytest.warns(DeprecationWarning, match="import jax_sparse_sync.bindings.selection"):
        old_selection = importlib.import_module("jax_sparse_sync.kernels.selection")
    assert old_comm is importlib.import_module("jax_sparse_sync.mesh.comm")
    assert old_selection.topk is jss.topk
    assert repr(jss.axis("data")) == "jss.axis('data')"  # still callable, not shadowed
    assert jss.axis("data") == old_comm.axis("data")
