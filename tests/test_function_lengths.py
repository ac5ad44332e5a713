"""Every function of the package fits on a screen: scripts/function_lengths.py's limits.

No function in ``jax_sparse_sync/`` longer than 80 lines of code (docstrings,
comments and blank lines excluded; a nested function counts in its parent too),
and each sync transform's factory at most 60: a factory builds its checked
configuration and hands the step to module-level phases.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "function_lengths.py"


def _lengths_module():
    spec = importlib.util.spec_from_file_location("function_lengths", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_no_function_over_the_limits():
    lengths = _lengths_module()
    assert lengths.violations() == []


def test_the_counter_counts_code_only(tmp_path):
    """A docstring, comments and blank lines are not code; nested functions count twice."""
    (tmp_path / "m.py").write_text(
        'def outer(a):\n'
        '    """A docstring\n\n    of several lines."""\n'
        '    # a comment\n'
        '\n'
        '    def inner(b):\n'
        '        return (b +\n'
        '                1)\n'
        '    return inner(a)\n')
    lengths = _lengths_module().function_lengths(tmp_path)
    assert lengths == {("m.py", "outer"): 5, ("m.py", "outer.inner"): 3}


def test_a_long_function_and_a_long_factory_are_reported():
    module = _lengths_module()
    fake = {("transforms/x.py", "long"): module.MAX_FUNCTION + 1,
            **{factory: module.MAX_FACTORY + 1 for factory in module.FACTORIES}}
    bad = module.violations(fake)
    assert len(bad) == 1 + len(module.FACTORIES)
    assert bad[0].startswith("transforms/x.py:long has 81 lines")
