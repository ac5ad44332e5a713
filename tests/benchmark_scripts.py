"""A benchmark script imported by a test, as it runs: ``benchmarks/`` on ``sys.path``
(for ``_harness`` and its sibling scripts), the script loaded from its file."""

import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_benchmark(name: str):
    """``benchmarks/<name>.py`` as a module (named ``_<name>``, apart from any installed one)."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    spec = importlib.util.spec_from_file_location(
        f"_{name}", os.path.join(ROOT, "benchmarks", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
