"""The API reference's tables against the package's ``__all__`` lists.

``docs/api.md`` lists every exported name in an ``autosummary`` table (each name
gets its own generated page). This module reads those tables from the page's
source and compares them with ``__all__`` of ``jax_sparse_sync`` and of its
public namespaces (the modules that ``jax_sparse_sync.__all__`` exports:
``jss.mpi``, ``jss.planning``). The docs build runs the comparison before
autosummary generates the pages (:func:`setup`) and warns on each difference
(``scripts/build_docs.sh`` builds with warnings as errors);
``tests/test_docs_api.py`` runs it without Sphinx.

Nothing here imports Sphinx at module level, so the test can import it.
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
from collections import Counter
from pathlib import Path

PACKAGE = "jax_sparse_sync"
API_PAGE = Path(__file__).resolve().parent.parent / "api.md"

_DIRECTIVE = re.compile(r"^(\s*)\.\. ([\w:-]+)::\s*(\S*)\s*$")
_OPTION = re.compile(r"^\s*:[\w-]+:")


def autosummary_entries(text: str) -> list[str]:
    """The fully qualified names in the ``autosummary`` tables of ``text`` (reST, or
    MyST Markdown whose ``eval-rst`` blocks hold the tables), in page order, repeats
    kept. A table's names are qualified by the last ``currentmodule`` above it.

    >>> autosummary_entries('''
    ... .. currentmodule:: pkg
    ...
    ... .. autosummary::
    ...    :toctree: _autosummary
    ...
    ...    f
    ...    C
    ...
    ... Text.
    ... ''')
    ['pkg.f', 'pkg.C']
    """
    module, names, table_indent = "", [], None
    for line in text.splitlines():
        directive = _DIRECTIVE.match(line)
        if directive:
            indent, name, argument = directive.groups()
            table_indent = len(indent) if name == "autosummary" else None
            if name in ("currentmodule", "py:currentmodule"):
                module = "" if argument == "None" else argument
            continue
        if table_indent is None or not line.strip():
            continue
        if len(line) - len(line.lstrip()) <= table_indent:  # the table ended
            table_indent = None
        elif not _OPTION.match(line):
            entry = line.strip().lstrip("~")
            names.append(f"{module}.{entry}" if module else entry)
    return names


def namespaces(package: str = PACKAGE) -> list[str]:
    """``package`` and the modules its ``__all__`` exports that have an ``__all__`` of
    their own (its public namespaces). Not ``jss.axis``, a function, even where an
    import of the deprecated ``jax_sparse_sync.axis`` package made it a callable module
    (``jax_sparse_sync/_moved.py``)."""
    top = importlib.import_module(package)
    return [package] + [f"{package}.{name}" for name in top.__all__
                        if inspect.ismodule(value := getattr(top, name))
                        and value.__name__ == f"{package}.{name}" and "__all__" in vars(value)]


def exported_names(package: str = PACKAGE) -> list[str]:
    """The fully qualified names of every namespace's ``__all__``."""
    return [f"{ns}.{name}" for ns in namespaces(package)
            for name in importlib.import_module(ns).__all__]


def differences(listed: list[str], exported: list[str]) -> list[str]:
    """What is wrong with ``listed`` (a page's entries) against ``exported``: an
    exported name not listed, a listed name not exported, a name listed twice.

    >>> differences(["p.a", "p.b", "p.b"], ["p.a", "p.c"])
    ['p.c is exported but not listed', 'p.b is listed but not exported', 'p.b is listed 2 times']
    """
    counts = Counter(listed)
    return ([f"{n} is exported but not listed" for n in exported if n not in counts]
            + [f"{n} is listed but not exported" for n in counts if n not in exported]
            + [f"{n} is listed {c} times" for n, c in counts.items() if c > 1])


def check_page(path: Path = API_PAGE) -> list[str]:
    """:func:`differences` of the API page's tables against the package's ``__all__``."""
    return differences(autosummary_entries(path.read_text()), exported_names())


def autosummary_context(package: str = PACKAGE) -> dict:
    """Context for the module template (``docs/_templates/autosummary/module.rst``):
    ``namespaces`` (their pages show the docstring only: their names have pages of their
    own) and ``module_sources`` (an exported module -> the module it is, e.g.
    ``jax_sparse_sync.planning.cost_model`` -> ``jax_sparse_sync.model.cost_model``)."""
    sources = {}
    for ns in namespaces(package):
        module = importlib.import_module(ns)
        for name in module.__all__:
            value = getattr(module, name)
            if inspect.ismodule(value):
                sources[f"{ns}.{name}"] = value.__name__
    return {"namespaces": namespaces(package), "module_sources": sources}


def _check(app) -> None:
    from sphinx.util import logging

    logger = logging.getLogger(__name__)
    for problem in check_page(Path(app.srcdir) / "api.md"):  # -W makes each one an error
        logger.warning("API table and __all__ differ: %s", problem, location="api",
                       type="jss", subtype="api_names")


def _constant_doc(app, what, name, obj, options, lines) -> None:
    """A re-exported constant (``jss.planning.GROUPINGS``, a tuple) has its type's
    docstring; use the ``#:`` comment of the module that assigns it instead."""
    if what != "data" or type(obj).__module__ != "builtins":
        return
    from sphinx.pycode import ModuleAnalyzer

    for modname, module in sorted(sys.modules.items()):
        if not modname.startswith(PACKAGE + ".") or module is None:
            continue
        for attr, value in list(vars(module).items()):
            if value is obj:
                try:
                    docs = ModuleAnalyzer.for_module(modname).find_attr_docs()
                except Exception:  # no source to analyze
                    continue
                if ("", attr) in docs:
                    lines[:] = list(docs[("", attr)])
                    return


def setup(app):
    # Before autosummary (priority 500) generates the pages from the tables.
    app.connect("builder-inited", _check, priority=400)
    app.connect("autodoc-process-docstring", _constant_doc)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
