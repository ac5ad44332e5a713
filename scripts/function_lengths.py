"""Lines of code of every function in jax_sparse_sync/ (docstrings, comments and blanks excluded).

    python scripts/function_lengths.py            # the 20 longest, and the limits' verdict
    python scripts/function_lengths.py --all      # every function over 40 lines

The limits (issue 54): no function longer than :data:`MAX_FUNCTION` lines of code,
and each sync transform's factory at most :data:`MAX_FACTORY`. A nested function
counts inside its parent as well as on its own: a factory's length includes its
closures. ``tests/test_package_layout.py`` holds the package to both.
"""

from __future__ import annotations

import ast
import io
import sys
import tokenize
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "jax_sparse_sync"
MAX_FUNCTION = 80
MAX_FACTORY = 60
#: the public sync transforms' factories: (module, function)
FACTORIES = (
    ("transforms/topk_sync.py", "topk_sync"),
    ("transforms/shared_support_sync.py", "shared_support_sync"),
    ("transforms/chunked_topk_sync.py", "chunked_topk_sync"),
    ("transforms/sharded_sync.py", "sharded_sync"),
    ("transforms/adam_direction_sync.py", "adam_direction_sync"),
    ("transforms/oktopk_sync.py", "oktopk_sync"),
    ("transforms/grouped.py", "grouped_sync"),
    ("transforms/grouped_topk_sync.py", "grouped_topk_sync"),
    ("transforms/dense_sync.py", "dense_sync"),
    ("transforms/block_sync.py", "block_sync"),
)


def _code_lines(source: str) -> set[int]:
    """Line numbers holding code: not blank, not only a comment."""
    lines = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT,
                        tokenize.DEDENT, tokenize.ENDMARKER):
            continue
        lines.update(range(tok.start[0], tok.end[0] + 1))
    return lines


def _docstring_lines(tree: ast.AST) -> set[int]:
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                lines.update(range(body[0].lineno, body[0].end_lineno + 1))
    return lines


def function_lengths(package: Path = PACKAGE) -> dict[tuple[str, str], int]:
    """``{(path relative to the package, qualified name): lines of code}`` for every function."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        source = path.read_text()
        tree = ast.parse(source)
        code = _code_lines(source) - _docstring_lines(tree)
        rel = str(path.relative_to(package))

        def visit(node, prefix):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    name = f"{prefix}{child.name}"
                    first = min([d.lineno for d in child.decorator_list] + [child.lineno])
                    out[(rel, name)] = len(code & set(range(first, child.end_lineno + 1)))
                    visit(child, name + ".")
                elif isinstance(child, ast.ClassDef):
                    visit(child, f"{prefix}{child.name}.")
                else:
                    visit(child, prefix)
        visit(tree, "")
    return out


def violations(lengths=None) -> list[str]:
    """What breaks the limits, one line each (empty when the package keeps them)."""
    lengths = function_lengths() if lengths is None else lengths
    bad = [f"{path}:{name} has {n} lines of code (at most {MAX_FUNCTION})"
           for (path, name), n in lengths.items() if n > MAX_FUNCTION]
    for path, name in FACTORIES:
        n = lengths.get((path, name))
        if n is None:
            bad.append(f"{path}:{name} not found (update FACTORIES)")
        elif n > MAX_FACTORY:
            bad.append(f"{path}:{name} (a sync factory) has {n} lines of code "
                       f"(at most {MAX_FACTORY})")
    return bad


def main(argv) -> int:
    lengths = function_lengths()
    ranked = sorted(lengths.items(), key=lambda kv: -kv[1])
    shown = [kv for kv in ranked if kv[1] > 40] if "--all" in argv else ranked[:20]
    for (path, name), n in shown:
        print(f"{n:5d}  {path}:{name}")
    bad = violations(lengths)
    print(f"{len(lengths)} functions; {len(bad)} over the limits"
          f" ({MAX_FUNCTION} lines a function, {MAX_FACTORY} a sync factory)")
    for line in bad:
        print("  " + line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
