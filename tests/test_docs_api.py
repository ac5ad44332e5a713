"""The API reference and the API tables follow the ``__all__`` lists, exactly.

``docs/api.md`` lists every exported name (``jss.__all__`` and the namespaces'
``jss.mpi.__all__``, ``jss.planning.__all__``) in an autosummary table, and the
Namespaces table of ``docs/topics/api_layout.md`` lists them too. These tests
read the pages' sources (no Sphinx needed) and fail on an exported name with no
entry, on an entry no longer exported, and on a name listed twice. The parsing
is ``docs/_ext/api_names.py``, which the docs build also runs (and stops on a
difference). The self-tests at the end feed doctored pages to the same checks.
"""

from __future__ import annotations

import doctest
import importlib.util
import re
from pathlib import Path

import pytest

import jax_sparse_sync as jss

ROOT = Path(__file__).resolve().parent.parent
API_LAYOUT = ROOT / "docs" / "topics" / "api_layout.md"


def _load_api_names():
    spec = importlib.util.spec_from_file_location("api_names", ROOT / "docs" / "_ext" / "api_names.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


api_names = _load_api_names()
EXPORTED = api_names.exported_names()
API_PAGE_TEXT = api_names.API_PAGE.read_text()


# --- docs/api.md ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", EXPORTED)
def test_exported_name_has_an_api_entry(name):
    assert name in api_names.autosummary_entries(API_PAGE_TEXT), \
        f"{name} is exported but docs/api.md has no autosummary entry for it"


def test_api_page_lists_only_exported_names_once():
    problems = api_names.differences(api_names.autosummary_entries(API_PAGE_TEXT), EXPORTED)
    assert not problems, "docs/api.md: " + "; ".join(problems)


def test_the_namespaces_are_mpi_and_planning():
    # Each module that jss.__all__ exports is a namespace whose names the page lists.
    assert api_names.namespaces() == ["jax_sparse_sync", "jax_sparse_sync.mpi",
                                      "jax_sparse_sync.planning"]
    assert len(EXPORTED) == len(jss.__all__) + len(jss.mpi.__all__) + len(jss.planning.__all__)


# --- docs/topics/api_layout.md ---------------------------------------------------------------


def _table(text: str, heading: str) -> list[list[str]]:
    """The rows (lists of cells) of the first Markdown table under ``## heading``."""
    section = re.split(r"^## ", text, flags=re.M)
    body = next(s for s in section if s.startswith(heading + "\n"))
    rows = [line.strip().strip("|").split("|") for line in body.splitlines()
            if line.startswith("|")]
    return [[cell.strip() for cell in row] for row in rows[2:]]  # past the header and |---|


def _code(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def namespace_table_entries(text: str) -> list[str]:
    """The fully qualified names of the Namespaces table (``jss`` -> ``jax_sparse_sync``)."""
    names = []
    for namespace, cell in (row[:2] for row in _table(text, "Namespaces")):
        module = _code(namespace)[0].replace("jss", "jax_sparse_sync", 1)
        names += [f"{module}.{name}" for name in _code(cell) if name != "__version__"]
    return names


def deprecated_table_names(text: str) -> list[str]:
    """The old top-level names (``jss.<name>``) in the Deprecated names table."""
    return [m.group(1) for row in _table(text, "Deprecated names") for code in _code(row[0])
            if (m := re.fullmatch(r"jss\.(\w+)", code))]


def layer_table_names(text: str) -> list[str]:
    return [name for row in _table(text, "Layers") for name in _code(row[1])]


def test_namespace_table_lists_exactly_the_exported_names():
    problems = api_names.differences(namespace_table_entries(API_LAYOUT.read_text()), EXPORTED)
    assert not problems, "docs/topics/api_layout.md, Namespaces: " + "; ".join(problems)


def test_deprecated_table_lists_exactly_the_deprecated_names():
    listed = deprecated_table_names(API_LAYOUT.read_text())
    assert sorted(listed) == sorted(jss._DEPRECATED)
    assert not set(listed) & set(jss.__all__)


def missing_layers(text: str) -> list[str]:
    """The Layers table's names that are no module or subpackage of the package."""
    package = Path(jss.__file__).parent
    return [name for name in layer_table_names(text)
            if not ((package.parent / name).is_file() or (package / name).is_dir()
                    or (package / f"{name}.py").is_file())]


def test_layer_table_names_existing_modules():
    assert missing_layers(API_LAYOUT.read_text()) == []


# --- the checks can fail ---------------------------------------------------------------------


def test_api_names_doctests():
    assert doctest.testmod(api_names).failed == 0


def test_a_doctored_api_page_is_caught():
    entries = API_PAGE_TEXT.splitlines()
    dropped = entries.index("   shared_support_sync")
    doctored = "\n".join(entries[:dropped] + ["   not_exported_any_more"] + entries[dropped + 1:]
                         + ["", ".. currentmodule:: jax_sparse_sync.mpi", "",
                            ".. autosummary::", "", "   set_timeout"])
    problems = api_names.differences(api_names.autosummary_entries(doctored), EXPORTED)
    assert problems == ["jax_sparse_sync.shared_support_sync is exported but not listed",
                        "jax_sparse_sync.not_exported_any_more is listed but not exported",
                        "jax_sparse_sync.mpi.set_timeout is listed 2 times"]


def test_a_doctored_namespace_table_is_caught():
    text = API_LAYOUT.read_text()
    doctored = text.replace("`sync_timeout`, ", "").replace("`GroupingPlan`", "`AxisComm`")
    assert doctored != text
    problems = api_names.differences(namespace_table_entries(doctored), EXPORTED)
    assert sorted(problems) == sorted([
        "jax_sparse_sync.mpi.sync_timeout is exported but not listed",
        "jax_sparse_sync.planning.GroupingPlan is exported but not listed",
        "jax_sparse_sync.planning.AxisComm is listed but not exported"])


def test_a_stale_layer_is_caught():
    doctored = API_LAYOUT.read_text().replace("| 3 | `bindings` |", "| 3 | `kernels` |")
    assert missing_layers(doctored) == ["kernels"]
