#!/usr/bin/env bash
# Builds the documentation site (Sphinx + MyST) with warnings as errors:
#
#   bash scripts/build_docs.sh        # after scripts/setup.sh; HTML in docs/_build/html
#
# Installs the pinned documentation requirements (docs/requirements.txt) into .venv
# when they are missing; autodoc imports the built package from .venv. The API
# reference (docs/api.md) gets one page per exported name in docs/_autosummary,
# generated anew each build; the build stops when its tables and the __all__ lists
# differ (docs/_ext/api_names.py; tests/test_docs_api.py checks the same without Sphinx).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  echo "[docs] no .venv: run bash scripts/setup.sh first" >&2
  exit 1
fi
if ! .venv/bin/python -m pip install -q -r docs/requirements.txt; then
  echo "[docs] could not install docs/requirements.txt" >&2
  exit 1
fi
rm -rf docs/_autosummary
# -E: a fresh environment, so the API tables' summaries follow edited docstrings
.venv/bin/python -m sphinx -E -W --keep-going -q -b html docs docs/_build/html
echo "[docs] built docs/_build/html/index.html"
