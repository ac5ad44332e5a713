"""Sphinx configuration of the jax_sparse_sync documentation (MyST Markdown).

Build: ``bash scripts/build_docs.sh`` (warnings are errors).
"""

import os
import sys

sys.path.insert(0, os.path.abspath(".."))

project = "jax_sparse_sync"
author = "jax_sparse_sync developers"
copyright = "2026, jax_sparse_sync developers"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build"]
root_doc = "index"

# Headings get GitHub-style anchors, so `page.md#some-heading` links work both here and on GitHub.
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]

autosummary_generate = True
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
