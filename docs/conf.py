"""Sphinx configuration of the jax_sparse_sync documentation (MyST Markdown).

Build: ``bash scripts/build_docs.sh`` (warnings are errors).
"""

import os
import sys

sys.path.insert(0, os.path.abspath(".."))
sys.path.insert(0, os.path.abspath("_ext"))

import api_names  # noqa: E402  (docs/_ext: the API page's tables against __all__)

project = "jax_sparse_sync"
author = "jax_sparse_sync developers"
copyright = "2026, jax_sparse_sync developers"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "api_names",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build"]
templates_path = ["_templates"]
root_doc = "index"

# Headings get GitHub-style anchors, so `page.md#some-heading` links work both here and on GitHub.
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]

# docs/api.md's autosummary tables: one generated page per exported name (in
# _autosummary/, deleted by scripts/build_docs.sh before each build). The
# api_names extension warns (an error in scripts/build_docs.sh) where the tables and
# the __all__ lists differ.
autosummary_generate = True
autosummary_context = api_names.autosummary_context()
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": False}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
# NamedTuple states list their fields under "Attributes:"; autodoc documents the fields too.
napoleon_use_ivar = True
# The docstrings' examples run under `pytest --doctest-modules`, not here.

html_theme = "alabaster"
html_title = "jax_sparse_sync"
