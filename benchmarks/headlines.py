"""Every README headline regenerated at one clean commit by one command, and the
provenance of every record in ``benchmarks/results/`` checked.

Each headline is an :class:`Entry` of :data:`HEADLINES`: the records it reads, the
benchmark commands that write them (exactly as run), a tiny ``--quick`` version of
each, and a summary that reads the numbers, the statistic and the caveats from the
records. The command runs the entries whose records are missing, unprovenanced or
stale (their measured code, :data:`MEASURES`, changed since the record's commit),
reuses the others and says why, then writes ``benchmarks/results/headlines.json`` and,
from it, the README's headline table and the results page's section (between the
``<!-- headlines:... -->`` markers), so a number there cannot differ from its record
(``tests/test_headlines.py`` checks both pages against the JSON and the JSON against
the records); it also rewrites the docs' result tables (``benchmarks/doc_tables/``).

    python -m benchmarks.headlines                 # at a clean commit: run what is stale
    python -m benchmarks.headlines --dry-run       # what would run, and why
    python -m benchmarks.headlines --quick         # every entry at a tiny size (a temp dir)
    python -m benchmarks.headlines --write         # no runs: the pages from the records
    python -m benchmarks.headlines --stale         # the stale list and the unprovenanced
    python -m benchmarks.headlines --render        # the pages from headlines.json only

(``python benchmarks/headlines.py`` works too.) Training runs are reused only while the
code they trained with is unchanged since the commit each run trained at
(``benchmarks/convergence.py --resume``). Measurements take ``/tmp/jss_measure.lock``
so that two never overlap. Results page: docs/results.md.
"""

from __future__ import annotations

import argparse
import ast
import fcntl
import fnmatch
import functools
import io
import json
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import tokenize
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
if str(HERE) not in sys.path:  # the benchmarks import each other as top-level modules
    sys.path.insert(0, str(HERE))
import doc_tables  # noqa: E402  (the docs' result tables; the lookups and rules they share)

OUT = RESULTS / "headlines.json"
README = ROOT / "README.md"
RESULTS_PAGE = ROOT / "docs" / "results.md"
MARKERS = ("<!-- headlines:start (written by benchmarks/headlines.py; do not edit) -->",
           "<!-- headlines:end -->")
MEASURE_LOCK = "/tmp/jss_measure.lock"


# --------------------------------------------------------------------------- git


def git(*args: str, check: bool = True) -> str:
    """``git args`` in the repository; its stdout, stripped."""
    return subprocess.run(["git", *args], cwd=ROOT, check=check, capture_output=True,
                          text=True, timeout=60).stdout.strip()


def head() -> str:
    return git("rev-parse", "--short=12", "HEAD")


def dirty_paths() -> list[str]:
    """Tracked files with changes (staged or not): a measurement here is not at a commit."""
    out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                          ":(exclude)benchmarks/results"],  # records are outputs, not code
                         cwd=ROOT, check=True, capture_output=True, text=True).stdout
    return [line[3:] for line in out.splitlines() if line.strip()]  # "XY path", unstripped


@functools.lru_cache(maxsize=None)
def shallow() -> bool:
    """A clone without the full history: ancestry cannot be checked there."""
    return git("rev-parse", "--is-shallow-repository", check=False) == "true"


def commit_problem(commit) -> str | None:
    """Why ``commit`` cannot name the code a record measured (None: it can): missing,
    ``+dirty``, not a commit of this repository, or not an ancestor of HEAD (the last two
    need the history: not checked in a shallow clone)."""
    if not isinstance(commit, str) or not commit:
        return "no commit"
    if commit.endswith("+dirty"):
        return f"{commit}: measured on a modified tree"
    if shallow():
        return None
    if subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=ROOT,
                      capture_output=True).returncode:
        return f"{commit}: not a commit of this repository"
    if subprocess.run(["git", "merge-base", "--is-ancestor", commit, "HEAD"], cwd=ROOT,
                      capture_output=True).returncode:
        return f"{commit}: not an ancestor of HEAD"
    return None


_CODE: dict[tuple[str, str], object] = {}
_C_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)


def code_text(text: str, path: str, strings: bool = True):
    """What a file computes, without what only explains it: a Python file's tokens less
    comments, docstrings and line breaks (``strings=False``: less every string literal, so a
    name only said in a message does not count), a C++/CUDA file's less comments and
    spacing, else its text."""
    if path.endswith(".py"):
        try:
            tree = ast.parse(text)
            docstrings = {(b[0].lineno, b[0].col_offset) for node in ast.walk(tree)
                          if isinstance(b := getattr(node, "body", None), list) and b
                          and isinstance(b[0], ast.Expr) and isinstance(b[0].value, ast.Constant)
                          and isinstance(b[0].value.value, str)}
            skip = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE)  # blocks: INDENT, DEDENT
            mark = {tokenize.INDENT: "{", tokenize.DEDENT: "}"}
            return " ".join(mark.get(t.type, t.string)
                            for t in tokenize.generate_tokens(io.StringIO(text).readline)
                            if t.type not in skip and not (t.type == tokenize.STRING and
                                                           (t.start in docstrings or not strings)))
        except (SyntaxError, tokenize.TokenError):
            return text
    if path.endswith((".h", ".cc", ".cu", ".cuh", ".cpp", ".c")):
        return " ".join(_C_COMMENT.sub(" ", text).split())
    return text


def read_blobs(blobs) -> dict[str, str]:
    """The text of git blobs, in one ``git cat-file --batch`` call."""
    blobs = list(dict.fromkeys(blobs))
    if not blobs:
        return {}
    out = subprocess.run(["git", "cat-file", "--batch"], cwd=ROOT, check=True,
                         input="\n".join(blobs).encode() + b"\n", capture_output=True).stdout
    texts, at = {}, 0
    for blob in blobs:  # "<sha> blob <size>\n<content>\n" each
        end = out.index(b"\n", at)
        size = int(out[at:end].split()[2])
        texts[blob] = out[end + 1:end + 1 + size].decode(errors="replace")
        at = end + 1 + size + 1
    return texts


def code_of(blob: str, path: str):
    """:func:`code_text` of a file version (a git blob; None: the file does not exist on
    that side), cached per blob."""
    if set(blob) == {"0"}:
        return None
    if (blob, path) not in _CODE:
        _CODE[(blob, path)] = code_text(read_blobs([blob])[blob], path)
    return _CODE[(blob, path)]


#: ``path::a,b``: of that Python file only the top-level definitions ``a`` and ``b`` count,
#: with the file's definitions they name (what a script's ``from m import a, b`` runs)
NAMED = "::"


def top_level_definitions(tree: ast.Module) -> dict[str, ast.stmt]:
    """A module's top-level functions, classes and assignments, by the names they bind."""
    defs: dict[str, ast.stmt] = {}
    for node in tree.body:
        targets = ([node] if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                   else node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, ast.AnnAssign) else [])
        for t in targets:
            for name in ([t.name] if hasattr(t, "name") else
                         [n.id for n in ast.walk(t) if isinstance(n, ast.Name)]):
                defs[name] = node
    return defs


def closure(tree: ast.Module, names) -> tuple[list[ast.stmt], set[str]]:
    """The top-level definitions ``names`` bind and those they name, transitively (in file
    order), and every name they use."""
    defs, todo, kept, used = top_level_definitions(tree), list(names), {}, set(names)
    while todo:
        name = todo.pop()
        if name in defs and name not in kept:
            kept[name] = defs[name]
            ids = {n.id for n in ast.walk(defs[name]) if isinstance(n, ast.Name)}
            used |= ids
            todo += ids
    return sorted({id(n): n for n in kept.values()}.values(), key=lambda n: n.lineno), used


def definitions_code(text: str | None, path: str, names: str) -> str | None:
    """:func:`code_text` of the top-level definitions ``names`` (comma-separated) of a Python
    file and of every top-level definition they name, transitively (None: no file)."""
    if text is None:
        return None
    try:
        nodes, _ = closure(ast.parse(text), names.split(","))
    except SyntaxError:
        return text
    return code_text("\n".join(ast.get_source_segment(text, n) for n in nodes), path)


@functools.cache
def blob_at(rev: str, path: str) -> str | None:
    """The git blob of ``path`` at ``rev`` (None: no such file there)."""
    return git("rev-parse", "--verify", "--quiet", f"{rev}:{path}", check=False) or None


@functools.cache
def blob_definitions(blob: str | None, path: str, names: str) -> str | None:
    return definitions_code(read_blobs([blob])[blob] if blob else None, path, names)


def named_changed(commit: str, spec: str) -> bool:
    """Whether the definitions a ``path::names`` entry names differ between ``commit`` and HEAD."""
    path, names = spec.split(NAMED)
    old, new = (blob_definitions(blob_at(rev, path), path, names) for rev in (commit, "HEAD"))
    return old != new


def changed_since(commit: str, paths) -> list[str]:
    """The files among ``paths`` (git pathspecs, or ``path::names``: :data:`NAMED`; Markdown
    never counts) whose code differs between ``commit`` and HEAD: comments, docstrings and
    spacing do not count."""
    named = [p for p in paths if NAMED in p]
    paths = [p for p in paths if NAMED not in p]
    out = git("diff", "--raw", "--no-abbrev", "-M", commit, "HEAD", "--", *paths,
              ":(exclude)*.md") if paths else ""
    rows = []
    for line in out.splitlines() if out else []:
        meta, *names = line.split("\t")  # a moved file: its old and its new path
        rows.append((*meta.split()[2:4], names[0], names[-1]))
    wanted = [(b, p) for old, new, p0, p1 in rows for b, p in ((old, p0), (new, p1))
              if set(b) != {"0"} and (b, p) not in _CODE]
    texts = read_blobs(b for b, _ in wanted)
    for b, p in wanted:
        _CODE[(b, p)] = code_text(texts[b], p)
    return ([p1 for old, new, p0, p1 in rows if code_of(old, p0) != code_of(new, p1)]
            + [p for p in named if named_changed(commit, p)])


# --------------------------------------------------------------------------- what records measure

#: the host library: Python package, FFI handlers and kernels (less the CUDA side: see
#: :data:`NOT_CUDA`)
HOST = ("jax_sparse_sync", "ffi", "kernels")
#: what a CPU record does not run: the CUDA sources, wherever they were at the time
#: (ffi/cuda/ now; ffi/*_cuda.*, ffi/cuda_handlers.h before e92d8dd). Not
#: ``cuda_missing.*``: the CPU module compiles it (the handlers that say the CUDA module
#: is missing)
NOT_CUDA = (":(exclude)*.cu", ":(exclude)*.cuh", ":(exclude)ffi/cuda", ":(exclude)*_cuda.*",
            ":(exclude)*cuda_handlers*")
#: the MPI collectives and their Python entry points
COLLECTIVES = ("ffi/collectives", "ffi/runtime", "ffi/handlers/module_cpu.cc",
               "kernels/sparse_stream.h", "kernels/parallel.h", "jax_sparse_sync/mpi",
               "jax_sparse_sync/ops", "jax_sparse_sync/base", "jax_sparse_sync/_ext.py")
SELECTION = ("kernels/topk_select.h", "kernels/threshold_select.h", "kernels/sparse_update.h",
             "kernels/parallel.h", "ffi/handlers/selection_ffi.cc", "jax_sparse_sync/bindings",
             "jax_sparse_sync/transforms/selection_policy.py", "jax_sparse_sync/_ext.py")
CUDA = ("ffi/cuda", "kernels")
HARNESS = ("benchmarks/_harness.py",)
NETWORK = ("benchmarks/emulated_network.py",)
STEP = (*HOST, *HARNESS, *NETWORK, "benchmarks/step_time.py", "benchmarks/step_timing")
#: the code a CPU training run ran: what makes its record stale, and what a re-run's
#: ``--resume`` compares before it reuses the run (``convergence.reuse_problem``); the CUDA
#: sources do not count, as in every CPU record's paths
TRAIN = (*HOST, *HARNESS, "examples/train.py", "examples/train_lm.py", "examples/train_resnet.py",
         "examples/models.py", *NOT_CUDA)

#: (pattern of record names, the paths whose changes make the record stale); the
#: first pattern that matches a record's name applies. Each also measures its script.
MEASURES: list[tuple[str, tuple[str, ...]]] = [
    ("headlines.json", ()),
    ("selection_gpu_*", (*SELECTION, *CUDA, *HARNESS)),
    ("selection_*", (*SELECTION, *HARNESS)),
    ("compression_*", ("kernels/qsgd.h", "kernels/block_scan.h", "ffi/handlers/compression_ffi.cc",
                       "jax_sparse_sync/bindings", *HARNESS)),
    ("allreduce_*", (*COLLECTIVES, *HARNESS)),
    ("dense_allreduce_*", (*COLLECTIVES, *HARNESS)),
    # the cost model it predicts with, and the algorithm choice of the calls it times
    # (jax_sparse_sync/model/sharded.py is jss.sharded_sync's: not measured here)
    ("sparcml_fig3*", (*COLLECTIVES, *HARNESS, *NETWORK, "jax_sparse_sync/model/cost_model.py",
                       "jax_sparse_sync/model/algorithm.py", "jax_sparse_sync/model/__init__.py")),
    ("oktopk_*", (*HOST, *HARNESS)),
    ("hash_partition_*", (*COLLECTIVES, *HARNESS, "jax_sparse_sync/mesh")),
    ("shard_map_example_*", (*HOST, *HARNESS, "examples/shard_map_experiment.py")),
    ("shard_map_*", (*HOST, *HARNESS)),
    ("step_time_campaign_*", (*STEP, *CUDA)),
    ("step_time_*", STEP),
    ("gpu_step_*", (*STEP, *CUDA, "benchmarks/gpu_step.py")),
    ("grouping_campaign_*", (*STEP, *CUDA, "benchmarks/grouping.py")),
    ("grouping_*", (*STEP, "benchmarks/grouping.py")),
    ("convergence_*", (*TRAIN, "benchmarks/convergence.py")),
    ("time_to_accuracy_*", (*TRAIN, *STEP, "benchmarks/time_to_accuracy.py")),
    # convergence.py's runs, timed by time_to_accuracy.py (both imported: measured_paths)
    ("outer_step_*", (*TRAIN, *STEP)),
    # trains examples/train_lm.py under its own launcher and times its steps
    ("sharded_state_*", TRAIN),
    ("warmup_wire_stages_*", (*TRAIN, *STEP, "benchmarks/time_to_accuracy.py")),
    ("fuzz_runs.json", ("fuzz", "ffi", "kernels", "scripts/fuzz.sh")),
    ("reliability.json", (*HOST, *HARNESS, *NETWORK)),
    ("*", (*HOST, *HARNESS)),
]
#: benchmark script of a record, where its name does not start with the script's
SCRIPT_OF = {"oktopk_hash_partition_time_": "hash_partition_time.py",
             "shard_map_cpu8": "shard_map_bench.py", "shard_map_example_": "shard_map_example.py",
             "step_time_campaign_": "step_time.py", "grouping_campaign_": "grouping.py",
             "grouping_timeline_": "grouping.py", "gpu_step_": "gpu_step.py",
             "reliability": "faults.py", "fuzz_runs": None, "headlines": "headlines.py",
             "update_profile_": "update_profile.py", "watchdog_": "watchdog.py"}


def script_of(record: str) -> str | None:
    """The ``benchmarks/`` script that writes ``record`` (None: not a benchmark script)."""
    for prefix, script in SCRIPT_OF.items():
        if record.startswith(prefix):
            return script
    stem = record.rsplit(".", 1)[0]
    for script in sorted(HERE.glob("*.py"), key=lambda p: -len(p.stem)):
        if stem.startswith(script.stem):
            return script.name
    return None


#: benchmarks/ modules a script imports without measuring through them: the provenance
#: tooling (convergence.py reads ``TRAIN`` and ``changed_since`` from here)
NOT_MEASURING = ("headlines", "doc_tables", "remeasure")


def module_path(module: str, base: Path = HERE) -> str | None:
    """The benchmarks/ file or package of an imported module, ``base`` the folder a relative
    import starts from (None: not one of ours)."""
    parts = module.split(".") if module else []
    if base == HERE and (not parts or parts[0] in NOT_MEASURING):
        return None
    for path in (base.joinpath(*parts).with_suffix(".py"), base.joinpath(*parts)):
        if parts and path.exists():
            return path.relative_to(ROOT).as_posix()
    return None


@functools.cache
def parsed(path: str) -> ast.Module:
    return ast.parse((ROOT / path).read_text())


@functools.cache
def names_used(path: str, name: str) -> frozenset[str]:
    """Every name the definition ``name`` of ``path`` uses, with those it names, transitively."""
    return frozenset(closure(parsed(path), [name])[1])


@functools.cache
def direct_imports(path: str) -> tuple[tuple[str, str, str | None], ...]:
    """(the name it binds, benchmarks/ path, the name taken from it or None: the whole
    module) per imported name, relative imports (``from .models import x``) included."""
    out = []
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.Import):
            out += [((a.asname or a.name).split(".")[0], p, None) for a in node.names
                    if (p := module_path(a.name))]
        elif isinstance(node, ast.ImportFrom):
            base = (ROOT / path).parents[node.level - 1] if node.level else HERE
            if p := module_path(node.module or "", base):
                out += [(a.asname or a.name, p, a.name) for a in node.names]
    return tuple(out)


@functools.cache
def imported_code(path: str) -> tuple[str, ...]:
    """What a benchmarks/ file runs of the other benchmarks/ modules: a whole module for
    ``import m``, ``m.py::a`` for ``from m import a`` (a package: all of it), and so on
    through what the module imports (for ``a``: what ``a``'s definitions use)."""
    out, todo, seen = [], [(path, None)], set()
    while todo:
        path, name = todo.pop()
        if (path, name) in seen:
            continue
        seen.add((path, name))
        imports = direct_imports(path)
        if name is not None:  # only the imports that the named definitions use
            used = names_used(path, name)
            imports = tuple(i for i in imports if i[0] in used)
        for _, p, taken in imports:
            whole = taken is None or not p.endswith(".py")
            out.append(p if whole else f"{p}{NAMED}{taken}")
            if p.endswith(".py"):
                todo.append((p, None if whole else taken))
    return tuple(dict.fromkeys(out))


def measured_paths(record: str) -> tuple[str, ...]:
    """The paths (git pathspecs, or ``path::names``) whose changes make ``record`` stale:
    its MEASURES entry, its script and what the script imports of the other scripts."""
    paths = next(p for pattern, p in MEASURES if fnmatch.fnmatch(record, pattern))
    script = script_of(record)
    if script:
        paths = (*paths, f"benchmarks/{script}", *imported_code(f"benchmarks/{script}"))
    whole = [p for p in paths if NAMED not in p]
    names: dict[str, set[str]] = {}  # a file's named definitions, where it is not whole
    for p in paths:
        if NAMED in p and not any(p.startswith((w + NAMED, w + "/")) for w in whole):
            file, listed = p.split(NAMED)
            names.setdefault(file, set()).update(listed.split(","))
    paths = (*dict.fromkeys(whole), *(f"{f}{NAMED}{','.join(sorted(n))}" for f, n in names.items()))
    return paths if "ffi/cuda" in paths else (*paths, *NOT_CUDA)


# --------------------------------------------------------------------------- provenance

#: records built from training runs that a script reuses (``--resume``): they must name
#: the commit each run trained at (``trained_at``: run -> commit)
TRAINED = ("convergence_*", "time_to_accuracy_*", "warmup_wire_stages_*", "sharded_state_*",
           "outer_step_*")

#: Records cited by the documentation whose provenance cannot be proven and which are
#: too expensive to measure again in one session: record -> why it is kept (empty while
#: every record names its commit and command). The stale list shows them;
#: tests/test_headlines.py fails on a record missing here that lacks provenance, and on one
#: listed here that has it (take it off the list).
UNPROVENANCED: dict[str, str] = {}


def provenance_problems(name: str, data) -> list[str]:
    """What a record lacks (empty: its commit and command are known): ``machine.commit``
    an ancestor of HEAD and not ``+dirty``, ``machine.command``, and for records built from
    training runs (:data:`TRAINED`) ``trained_at``, a clean ancestor commit per run."""
    machine = data.get("machine") if isinstance(data, dict) else None
    if not isinstance(machine, dict):
        return ["no machine entry (no commit, no command)"]
    problems = []
    if (why := commit_problem(machine.get("commit"))) is not None:
        problems.append(f"machine.commit: {why}")
    if not isinstance(machine.get("command"), str) or not machine["command"].strip():
        problems.append("machine.command: missing")
    if any(fnmatch.fnmatch(name, p) for p in TRAINED):
        trained = data.get("trained_at")
        if not isinstance(trained, dict) or not trained:
            problems.append("trained_at: missing (the commit each training run ran at)")
        else:
            problems += [f"trained_at[{run}]: {why}" for run, c in sorted(trained.items())
                         if (why := commit_problem(c)) is not None]
    return problems


def record_names() -> list[str]:
    return sorted(p.name for p in RESULTS.glob("*.json"))


def load(name: str, results: Path = RESULTS):
    return json.loads((results / name).read_text())


def stale_entry(name: str, data) -> dict | None:
    """``record`` with why it is stale: unprovenanced (its problems), or the measured files
    changed since its commit (and since each run's training commit); None if fresh."""
    problems = provenance_problems(name, data)
    if problems:
        return {"record": name, "commit": (data.get("machine") or {}).get("commit")
                if isinstance(data, dict) else None, "unprovenanced": problems,
                "why_kept": UNPROVENANCED.get(name)}
    commit = data["machine"]["commit"]
    changed = changed_since(commit, measured_paths(name))
    for run, c in sorted((data.get("trained_at") or {}).items()):
        if c is None:  # a record outside TRAINED: its run's code unknown, so not fresh
            changed.append(f"(run {run}: no training commit)")
            continue
        changed += [f"{f} (since run {run} trained)" for f in changed_since(c, TRAIN)
                    if f not in changed]
    if not changed:
        return None
    changed.sort(key=lambda f: (f.startswith("benchmarks/"), f))  # the library's code first
    return {"record": name, "commit": commit, "changed": changed}


def stale_list(names=None) -> list[dict]:
    """:func:`stale_entry` of every record (or of ``names``) that is stale."""
    out = []
    for name in names if names is not None else record_names():
        entry = stale_entry(name, load(name))
        if entry is not None:
            out.append(entry)
    return out


# --------------------------------------------------------------------------- statistics


def median_range(values) -> tuple[float, float, float, int]:
    """(median, min, max, count) of the values that are not None."""
    vals = [v for v in values if v is not None]
    if not vals:
        return (float("nan"), float("nan"), float("nan"), 0)
    return statistics.median(vals), min(vals), max(vals), len(vals)


def paired(a: dict, b: dict) -> tuple[float, float, float, int]:
    """The paired ratio ``a[r] / b[r]`` over the keys (repeats, rounds, seeds) both
    measured: :func:`median_range` of the per-pair ratios."""
    return median_range([a[r] / b[r] for r in a if r in b and a[r] and b[r]])


def x(v: float, digits: int = 1) -> str:
    return "-" if v != v else f"{v:.{digits}f}x"


def ms(seconds: float) -> str:
    v = 1e3 * seconds
    return f"{v:,.0f}" if v >= 1000 else f"{v:.1f}"


def size_label(n: int) -> str:
    """16777216 -> ``16M``, 65536 -> ``64K``."""
    return f"{n >> 20}M" if n >= 1 << 20 else f"{n >> 10}K"


def link_label(link) -> str:
    link = str(link)
    return {"shm": "shared memory"}.get(link, f"{int(float(link))} Mbit/s"
                                       if float(link) < 1000 else f"{float(link) / 1000:g} Gbit/s")


def by_repeat(record: dict, link: str, mode: str) -> dict:
    """A step_time.py record's step seconds of ``mode`` on ``link`` per repeat."""
    return {r.get("repeat", 0): r["step_s"] for r in record.get("runs", record["records"])
            if str(r["link"]) == link and r["mode"] == mode and r.get("step_s")}


def busy_caveat(values) -> list[str]:
    """The load a measurement ran under: the CPUs' busy fraction just before its jobs."""
    m = median_range(v for v in values if isinstance(v, (int, float)))
    if not m[3]:
        return []
    return [f"the CPUs were {100 * m[0]:.0f} % busy (median; {100 * m[1]:.0f}-{100 * m[2]:.0f} %) "
            "with other work just before its jobs"]


def headline(text: str, statistic: str, caveats=(), **numbers) -> dict:
    """A summary: the sentence, the statistic its numbers are, the caveats, the numbers."""
    return {"text": text, "statistic": statistic, "caveats": list(caveats), "numbers": numbers}


# --------------------------------------------------------------------------- the summaries


def step_time_summary(recs: dict) -> dict:
    """Headline 1 from step_time.py's MLP record: Top-k 0.1 % (and 1 %) against both dense
    baselines and the no-sync step, per link, paired within each repeat."""
    rec = next(iter(recs.values()))
    links = [l for l in ("1000", "200", "shm") if by_repeat(rec, l, "dense")]
    parts, nums, counts = [], {}, set()
    for link in links:
        t = {m: by_repeat(rec, link, m) for m in rec["modes"]}
        sparse = "topk_0.1pct_auto" if t.get("topk_0.1pct_auto") else "topk_1pct_auto"
        d, b, n = (paired(t["dense"], t[sparse]), paired(t.get("dense_bf16", {}), t[sparse]),
                   paired(t[sparse], t.get("none", {})))
        one = paired(t["dense"], t.get("topk_1pct_auto", {}))
        counts.add(d[3])
        nums[link] = {"sparse": sparse, "x_dense": d[0], "x_bf16": b[0], "x_none": n[0],
                      "x_dense_1pct": one[0], "repeats": d[3],
                      **{f"{m}_ms": 1e3 * median_range(t.get(m, {}).values())[0]
                         for m in ("none", "dense", "dense_bf16", sparse)}}
        v = nums[link]
        parts.append(f"at {link_label(link)} {x(d[0])} faster than `dense_sync` and {x(b[0])} "
                     f"faster than the bf16 dense baseline ({ms(v[sparse + '_ms'] / 1e3)} ms a step "
                     f"against {ms(v['dense_ms'] / 1e3)} and {ms(v['dense_bf16_ms'] / 1e3)} ms; "
                     f"{x(n[0], 2)} the no-sync step; at 1 % {x(one[0])} faster than dense)")
    density = "0.001" if nums and nums[links[0]]["sparse"] == "topk_0.1pct_auto" else "0.01"
    model = rec["models"].get("mlp", {})
    text = (f"MLP ({model.get('layers')} hidden layers of {model.get('hidden')}), "
            f"P = {rec['procs'][0]}, `topk_sync(density={density})`: " + "; ".join(parts))
    return headline(text, f"paired medians of {'/'.join(map(str, sorted(counts)))} repeats "
                          "(a repeat: one job timing every mode in turn; the ratio taken "
                          "within it); ms: median over repeats",
                    [f"{rec['procs'][0]} ranks on {rec['machine']['cpu_count']} cores "
                     "(oversubscribed); links shaped by tc (rate only, no added delay)",
                     *busy_caveat(r.get("cpu_busy_before") for r in rec.get("runs", []))],
                    links=nums)


def cost_model_summary(recs: dict) -> dict:
    """Headline 5: how many regenerated step_time.py points the cost model predicts within
    25 %, with the GPU campaign's host runs (a core per rank) beside them."""
    here, hosts, repeats = [], {}, set()
    for name, rec in recs.items():
        points = [(r["link"], r["mode"], r.get("measured_over_predicted_median"))
                  for r in rec["records"] if r["mode"] != "none"]
        if "campaign" in name:
            for _, mode, ratio in points:
                hosts.setdefault(mode, []).append(ratio)
        else:
            here += points
            repeats |= {len(r.get("repeats_measured_over_predicted") or [1])
                        for r in rec["records"] if r["mode"] != "none"}
    ratios = [r for _, _, r in here if r is not None]
    inside = sum(map(doc_tables.within_25pct, ratios))
    lo, hi = (min(ratios), max(ratios)) if ratios else (float("nan"),) * 2
    host = {m: (min(v), max(v)) for m, v in hosts.items() if v and None not in v}
    text = (f"{inside} of {len(ratios)} measured (link, sync) step times of the MLP headline "
            f"run within 25 % of `jss.planning.cost_model.predict_step_time` (measured / "
            f"predicted {lo:.2f}-{hi:.2f})")
    if host:
        text += ("; on the 16-core GPU hosts with a core per rank (shared memory) it measured "
                 + ", ".join(f"{m} {a:.2f}-{b:.2f}x" for m, (a, b) in sorted(host.items()))
                 + " of the prediction")
    return headline(text, f"each point: the median over its {'/'.join(map(str, sorted(repeats)))} "
                          "repeats of measured / predicted",
                    ["checked only where measured: this VM's emulated links at P = 4; the "
                     "host runs show the model off by up to 1.42x there"],
                    within_25pct=inside, points=len(ratios), low=lo, high=hi, hosts=host)


def seed_finals(rec: dict) -> dict:
    """``{mode: {seed: final metric}}`` of a convergence.py record (one seed before --seeds)."""
    if "seed_finals" in rec:
        return {m: {int(s): v for s, v in f.items()} for m, f in rec["seed_finals"].items()}
    metric = rec["metric"]
    return {r["mode"]: {rec.get("seed", 0): r[f"final_{metric}"]} for r in rec["table"]}


def accuracy_summary(recs: dict) -> dict:
    """Headline 2: the final metric at 1 % and 0.1 % against dense, paired by seed."""
    parts, nums, caveats = [], {}, []
    models = {}  # per model the record over seeds where there is one, else the single seed
    for name, rec in recs.items():
        if "seed_finals" in rec or rec["model"] not in models:
            models[rec["model"]] = (name, rec)
    for _, rec in models.values():
        finals, lower = seed_finals(rec), rec["lower_is_better"]
        dense = finals.get("dense", {})
        cells = []
        for mode in ("topk_1pct_adamdir_mask_ramp", "topk_0.1pct_adamdir_mask_ramp"):
            if mode not in finals:
                continue
            gaps = doc_tables.seed_gaps(rec, mode, finals)
            g, f = median_range(gaps.values()), median_range(finals[mode].values())
            nums[f"{rec['model']}:{mode}"] = {"final": f[0], "gap": g[0], "gap_min": g[1],
                                              "gap_max": g[2], "seeds": g[3]}
            unit = "%" if lower else " pt"
            spread = f" [{g[1]:+.2f}, {g[2]:+.2f}] over {g[3]} seeds" if g[3] > 1 else ""
            cells.append(f"{'1 %' if '_1pct' in mode else '0.1 %'}: {f[0]:.{3 if lower else 2}f}"
                         f"{'' if lower else ' %'}, gap {g[0]:+.2f}{unit}{spread}")
        d = median_range(dense.values())
        what = ("ResNet-style CNN, test accuracy" if rec["model"] == "cnn"
                else "byte-level transformer LM, validation loss")
        parts.append(f"{what} (P = {rec['procs']}; dense {d[0]:.{3 if lower else 2}f}"
                     f"{'' if lower else ' %'}): " + "; ".join(cells))
        if rec["model"] == "cnn":
            caveats.append("CNN: 360 test images, one image is 0.28 points")
        if g[3] < 3:
            caveats.append(f"{rec['model']}: {g[3]} seed{'s' * (g[3] > 1)} only")
    out = headline("Adam-direction sync with DGC's ramp and momentum masking: "
                   + "; ".join(parts), "median [min, max] over seeds of the gap to dense's "
                   "run with the same seed (count per model)", caveats, **nums)
    return {**out, "used": [name for name, _ in models.values()]}


def kernel_times(rec: dict, method: str, n: int, density: float) -> dict:
    """A selection.py record's seconds of ``method`` at (N, density) per interleaved round."""
    r = doc_tables.selection_entry(rec["records"], method, n, density)
    return {} if r is None else dict(enumerate(r["times_s"]))


def selection_summary(recs: dict) -> dict:
    """Headline 3: ``jss.topk`` against ``jax.lax.top_k(|x|)``, paired by round, on the
    CPU (16M) and the GPUs (64M, 256M), at 1 %."""
    parts, nums, counts = [], {}, set()
    for name, rec in recs.items():
        sizes = sorted({r["N"] for r in rec["records"]})
        wanted = [n for n in sizes if n >= 64 << 20] if "gpu" in name else \
            [n for n in sizes if n <= 16 << 20][-1:]
        cells = []
        for n in wanted:
            r = paired(kernel_times(rec, "lax.top_k", n, 0.01), kernel_times(rec, "topk", n, 0.01))
            if r[3]:
                counts.add(r[3])
                nums[f"{name}:{n}"] = {"ratio": r[0], "rounds": r[3]}
                cells.append(f"{x(r[0])} faster at N = {size_label(n)}")
        where = rec["machine"].get("device") if "gpu" in name else "CPU"
        parts.append(f"on {'an ' + where if 'gpu' in name else 'the ' + where} " + " and ".join(cells))
    return headline("`jss.topk` against `jax.lax.top_k` of the magnitudes, k = 1 %: "
                    + "; ".join(parts),
                    f"paired medians over {'/'.join(map(str, sorted(counts)))} interleaved "
                    "rounds", ["the GPU records come from the device campaign; this command "
                               "reruns them only on a GPU host"], **nums)


def gpu_step_summary(recs: dict) -> dict:
    """Headline 7: the sparse step on GPU arrays (benchmarks/gpu_step.py, the device
    campaign): the sync's step against the step without it, the examples' LM and the
    64M-parameter MLP, each mode's median step over the median of its baseline's."""
    parts, nums, steps, identical = [], {}, set(), True
    for name, rec in recs.items():
        rows = [r for r in rec["records"] if r.get("transport", "mpi") == "mpi"
                and r.get("ratio_to_baseline") is not None]
        steps |= {len(r["step_times_s"]) for r in rows if r.get("step_times_s")}
        for r in rows:
            if r["model"] == "lm" and r["mode"] in ("topk_1pct", "adam_topk_1pct"):
                what = ("`adam_direction_sync(topk_sync(1 %))` against AdamW"
                        if r["mode"] == "adam_topk_1pct" else "`topk_sync` 1 % + SGD against SGD")
            elif r["model"] == "mlp" and r["mode"] == "topk_1pct" and r["N"] >= 64 << 20:
                what = f"`topk_sync` 1 % on the {size_label(r['N'])} MLP at P = {r['P']}"
            else:
                continue
            identical &= r.get("replicas_identical") is True
            nums[f"{name}:{r['mode']}:P{r['P']}"] = {"ratio": r["ratio_to_baseline"],
                                                     "step_s": r["step_s"]}
            parts.append(f"{what} {x(r['ratio_to_baseline'], 2)} ({ms(r['step_s'])} ms)")
    device = next(iter(recs.values()))["machine"].get("device", "a GPU")
    bare = [r["step_s"] for rec in recs.values() for r in rec["records"]
            if r["model"] == "mlp" and r["mode"] == "none" and r["N"] >= 64 << 20] or [float("nan")]
    lm = next((r["N"] for rec in recs.values() for r in rec["records"] if r["model"] == "lm"), 0)
    return headline(f"The sync's step over the step without it on an {device}, the examples' "
                    f"LM at {lm / 1e6:.1f}M parameters (P = 1) and an MLP: " + "; ".join(parts),
                    f"ratio of the medians of {'/'.join(map(str, sorted(steps)))} steps, one job "
                    "per record" + (", every replica bitwise identical" if identical else
                                    "; NOT every replica was bitwise identical"),
                    ["one device, once: the GPU records come from the device campaign; at P = 2 "
                     "both ranks share the one GPU",
                     f"the 64M MLP's no-sync step is {ms(min(bare))}-{ms(max(bare))} ms, so the "
                     "sync's fixed costs weigh more there than on the LM"], **nums)


def sparcml_summary(recs: dict) -> dict:
    """Headline 4: each sparse algorithm's speed-up over ``MPI_Allreduce`` (``dense``) at the
    largest P and 1 %, per transport, paired by repeat."""
    rec = next(iter(recs.values()))
    p, parts, nums = max(rec["procs"]), [], {}
    for t in rec["transports"]:
        rows = [r for r in t["records"] if r["P"] == p and (r["density"] == 0.01 or
                                                          r["algorithm"] == "dense")]
        times = {r["algorithm"]: dict(enumerate(r["times_s"])) for r in rows}
        if "dense" not in times:
            continue
        best = {a: paired(times["dense"], v) for a, v in times.items() if a != "dense"}
        if not best:
            continue
        algo = max(best, key=lambda a: best[a][0])
        nums[t["name"]] = {a: {"speedup": v[0], "repeats": v[3]} for a, v in best.items()}
        parts.append(f"{t['name'].replace('Mbit', ' Mbit/s').replace('shm', 'shared memory')}: "
                     f"{algo.replace('_', ' ')} {x(best[algo][0])} "
                     f"(dense {ms(median_range(times['dense'].values())[0])} ms)")
    n = rec["N"]
    return headline(f"Sparse allreduce against `MPI_Allreduce`, N = {size_label(n)}, P = {p}, "
                    "d = 1 %, the fastest algorithm per link: " + "; ".join(parts),
                    f"paired medians of {rec['repeats']} repeats (algorithms interleaved "
                    "within a repeat)", [f"{p} ranks on {rec['machine'].get('cpu_count')} cores",
                                         *busy_caveat(f.get("cpu_busy_before")
                                                      for t in rec["transports"]
                                                      for f in t.get("fragments", []))],
                    **nums)


def grouping_summary(recs: dict) -> dict:
    """Headline 6: the planner's plan (``auto``) against one sync after the backward pass
    (``ungrouped``), paired by round, whether it was the fastest plan measured, and the
    plans' distance from their predictions."""
    parts, nums = [], {}
    for name, rec in recs.items():
        run = rec["runs"][0]
        plans = {r["plan"]: r for r in run["records"]}
        auto, flat = plans.get("auto"), plans.get("ungrouped")
        if not auto or not flat:
            continue
        def rounds(r):
            return dict(enumerate(r.get("round_medians_s") or [r["measured_s"]]))
        gain = paired(rounds(flat), rounds(auto))
        timed = {k: v["measured_s"] for k, v in plans.items() if k not in ("no_sync", "auto")}
        fastest = min(timed, key=timed.get)
        behind = paired(rounds(auto), rounds(plans[fastest]))[0]
        errors = {when: [v["measured_s"] / v[key] - 1 for v in plans.values() if v.get(key)]
                  for when, key in (("now", "predicted_s"), ("at_run", "predicted_at_run_s"))}
        worst = {w: max(e, key=abs) for w, e in errors.items() if e}
        nums[name] = {"speedup": gain[0], "rounds": gain[3], "auto_groups": auto.get("groups"),
                      "fastest": fastest, "auto_over_fastest": behind,
                      "worst_prediction_error": worst.get("now"),
                      "worst_prediction_error_at_run": worst.get("at_run", worst.get("now"))}
        model = {"transformer": "LM", "mlp": "MLP", "cnn": "CNN"}.get(run["model"], run["model"])
        groups = auto.get("groups")
        fast = ("the fastest plan measured" if plans[fastest]["measured_s"] >= auto["measured_s"]
                else f"{fastest} measured {x(behind, 2)} faster")
        pred = f"plans within {100 * abs(worst.get('now', float('nan'))):.0f} % of their predictions"
        if "at_run" in worst:
            pred = (f"plans within {100 * abs(worst['at_run']):.0f} % of the predictions made at "
                    f"the run, {100 * abs(worst['now']):.0f} % of the ones re-made after it")
        parts.append(f"{model} {run['sync']} at {link_label(run['link'])}, P = {run['P']}: "
                     f"{x(gain[0], 2)} ({groups} group{'s' * (groups != 1)}; {fast}; {pred})")
    return headline("The planner's layer grouping (`jss.planning.auto_grouping`) against one "
                    "sync after the backward pass: " + "; ".join(parts),
                    "paired medians over the interleaved rounds (count in the record)",
                    ["a core per rank (P = 2 on the 2 cores); re-made predictions were "
                     "recomputed after the run (grouping.py --repredict) under rules added "
                     "later"], **nums)


#: the one time-to-accuracy mode quoted at every P and link (fp32 wire, DGC ramp, masking)
TTA_MODE = "topk_1pct_adamdir_mask_ramp_enc"


def tta_summary(recs: dict) -> dict:
    """Headline 7: time to dense's final metric of :data:`TTA_MODE` at every (model, link,
    P), against ``dense_sync`` and the bf16 dense baseline, paired by timing repeat, with
    the caveats each record shows (bf16 dense faster, a target never reached, no bf16 run)."""
    parts, nums, caveats = [], {}, []
    for name, rec in sorted(recs.items()):
        rows = {r["mode"]: r for r in rec["records"]}
        r = rows.get(TTA_MODE)
        if r is None:
            continue
        key = f"{rec['model']} {link_label(rec['link_mbit'])} P = {rec['P']}"
        nums[key] = {k: r.get(k) for k in ("speedup_over_dense_paired",
                                           "speedup_over_dense_bf16_paired",
                                           "fraction_of_ideal_paired", "timing_repeats_paired",
                                           "speedup_over_dense_smoothed_paired")}
        reach = ("never reached" if r.get("steps_to_target") is None else
                 f"{x(r['speedup_over_dense_paired'], 2)} / "
                 f"{x(r.get('speedup_over_dense_bf16_paired') or float('nan'), 2)}, "
                 f"{r['fraction_of_ideal_paired']:.2f} of ideal")
        parts.append(f"{key}: {reach}")
        bf16 = rows.get("dense_bf16")
        if bf16 and r.get("speedup_over_dense_paired") and \
                (bf16.get("speedup_over_dense_paired") or 0) > r["speedup_over_dense_paired"]:
            caveats.append(f"{key}: the bf16 dense baseline reaches the target sooner "
                           f"({x(bf16['speedup_over_dense_paired'], 2)} against "
                           f"{x(r['speedup_over_dense_paired'], 2)})")
        if "smoothed" in " ".join(r) and r.get("steps_to_target_smoothed") is None:
            caveats.append(f"{key}: never reaches the target read from 3 evaluations")
        if "no dense_bf16 run" in str(r.get("baseline_bf16_convergence")):
            caveats.append(f"{key}: no bf16 dense run; assumed to converge as dense")
    return headline(f"Time to dense's final metric, `{TTA_MODE}` everywhere (x `dense_sync` / x "
                    "bf16 dense, fraction of a free sync's speed-up): " + "; ".join(parts),
                    "paired medians over the timing repeats (each run timed step by step on "
                    "the emulated link; count per record)", caveats, **nums)


# --------------------------------------------------------------------------- the headlines


@dataclass(frozen=True)
class Run:
    """One benchmark command: ``command`` as its record's ``machine.command`` reads (the
    script's name, then its arguments; run as ``python benchmarks/<script> ...`` from the
    repository root), the records it writes, and a tiny version of it (``{tmp}``: the
    folder its records go to) for ``--quick``."""
    command: str
    writes: tuple[str, ...]
    quick: str
    minutes: float
    where: str = "cpu"    # "gpu": measured on a GPU host (scripts/gpu_session.sh), reused here
    lock: bool = True     # False: the script takes the measurement lock itself
    heavy: bool = False   # hours of training: run only with --heavy
    fallback: str | None = None  # the record quoted until this run's exists (flagged as such)


@dataclass(frozen=True)
class Entry:
    """A README headline: its runs, the records it reads besides theirs, its summary."""
    name: str
    title: str
    runs: tuple[Run, ...]
    summarize: Callable[[dict], dict]
    reads: tuple[str, ...] = ()

    @property
    def records(self) -> tuple[str, ...]:
        return self.records_in(RESULTS)

    def records_in(self, results: Path) -> tuple[str, ...]:
        """The records the summary reads: each run's, or its fallback while neither
        ``results`` nor benchmarks/results holds it."""
        names = [r.fallback if r.fallback and not all(
                     (results / w).exists() or (RESULTS / w).exists() for w in r.writes)
                 else w for r in self.runs for w in r.writes]
        return tuple(dict.fromkeys(names + list(self.reads)))

    def stand_ins(self, results: Path) -> dict[str, str]:
        """``{fallback record: the run's record it stands in for}`` in use now."""
        used = self.records_in(results)
        return {r.fallback: w for r in self.runs for w in r.writes
                if r.fallback in used and w not in used}


MLP_STEP = ("step_time.py --models mlp --links 1000 200 --procs 4 --modes none dense dense_bf16 "
            "topk_1pct_auto topk_0.1pct_auto --steps 12 --warmup 1 --max-seconds-per-mode 8 "
            "--repeats 3 --quiet-wait 300 --tag headline_mlp")
#: grouping.py's ranks on the P = 2 runs: one XLA thread, MPICH's yield, glibc's heap tuned
GROUPING_ENV = ("--rank-env XLA_FLAGS=--xla_cpu_multi_thread_eigen=false "
                "intra_op_parallelism_threads=1 MPIR_CVAR_ENABLE_HEAVY_YIELD=1 "
                "MPIR_CVAR_CH4_PROGRESS_THROTTLE=1 MALLOC_MMAP_THRESHOLD_=1073741824 "
                "MALLOC_TRIM_THRESHOLD_=4294967296 MALLOC_ARENA_MAX=1")
CONVERGENCE = ("convergence.py --models {model} --modes dense topk_1pct_adamdir_mask_ramp "
               "topk_0.1pct_adamdir_mask_ramp --seeds 0 1 2 --resume --work-dir "
               "/tmp/jss_headlines/convergence --timeout 14400 --tag seeds")
QUICK_CONVERGENCE = ("convergence.py --models cnn --modes dense topk_1pct_adamdir_mask_ramp "
                     "--seeds 0 --procs 2 --steps 2 --work-dir {tmp}/runs --out-dir {tmp} "
                     "--tag seeds --extra --widths 4 8 --blocks 1 --log-every 1")


def tta_run(model: str, link: int, p: int, minutes: float) -> Run:
    """time_to_accuracy.py at one (model, link, P): train (or reuse) and time every mode."""
    name = f"time_to_accuracy_{model}_{'1gbit' if link == 1000 else f'{link}mbit'}_p{p}.json"
    return Run(f"time_to_accuracy.py --model {model} --link {link} --procs {p} --eval-every "
               f"{5 if model == 'lm' else 10} --resume --work-dir /tmp/jss_headlines/tta_{model}_p{p} "
               "--modes dense dense_bf16 topk_1pct_adamdir_mask_ramp_enc --timing-repeats 7"
               + (" --smooth 3" if model == "cnn" else ""), (name,),
               "", minutes, lock=False, heavy=True)


#: records made at a clean commit by an earlier form of their headline run's command, as
#: each record's ``machine.command`` reads: what they measured is that command's (here the
#: output went to a scratch folder and there was no ``--timeout``); the next run replaces them
EARLIER_COMMANDS: dict[str, str] = {
    "grouping_lm_dense_200mbit_p2.json": (
        "grouping.py --models transformer --syncs dense --links 200 --procs 2 "
        "--pin-cores --autogroup-nice -19 --rounds 4 --steps 2 --tag "
        "lm_dense_200mbit_p2 --out-dir /work/scratch/grp_lmd --rank-env "
        "XLA_FLAGS=--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1 "
        "MPIR_CVAR_ENABLE_HEAVY_YIELD=1 MPIR_CVAR_CH4_PROGRESS_THROTTLE=1 "
        "MALLOC_MMAP_THRESHOLD_=1073741824 MALLOC_TRIM_THRESHOLD_=4294967296 "
        "MALLOC_ARENA_MAX=1"),
}


HEADLINES: tuple[Entry, ...] = (
    Entry("step_time", "Training step, 7.5M-parameter MLP, P = 4", (
        Run(MLP_STEP, ("step_time_headline_mlp.json",),
            "step_time.py --models mlp --links shm --procs 2 --modes none dense dense_bf16 "
            "topk_0.1pct_auto --steps 2 --warmup 0 --max-seconds-per-mode 2 --repeats 1 "
            "--mlp-hidden 64 --mlp-layers 1 --out-dir {tmp} --tag headline_mlp", 12),),
        step_time_summary),
    Entry("accuracy", "Accuracy at 1 % and 0.1 %", (
        # training is not timed: no measurement lock (run the command under nice -n 19)
        Run(CONVERGENCE.format(model="cnn"), ("convergence_cnn_seeds.json",), QUICK_CONVERGENCE,
            60, lock=False, heavy=True),
        Run(CONVERGENCE.format(model="lm"), ("convergence_lm_seeds.json",), "", 150,
            lock=False, heavy=True)), accuracy_summary),
    Entry("time_to_accuracy", "Time to accuracy", tuple(
        tta_run(m, link, p, minutes) for m, link, p, minutes in (
            ("lm", 1000, 2, 60), ("lm", 200, 2, 60), ("lm", 1000, 4, 90), ("lm", 200, 4, 90),
            ("cnn", 1000, 2, 20), ("cnn", 200, 2, 20), ("cnn", 1000, 4, 30),
            ("cnn", 200, 4, 30))), tta_summary),
    Entry("selection", "Selection kernels", (
        Run("selection.py --sizes 16M --densities 0.01 --repeats 9 --quiet-wait 20 "
            "--out benchmarks/results/selection_headline_cpu.json",
            ("selection_headline_cpu.json",),
            "selection.py --sizes 64K --densities 0.01 --repeats 3 --warmup 1 "
            "--out {tmp}/selection_headline_cpu.json", 3, fallback="selection_cpu.json"),),
        selection_summary, reads=("selection_gpu_h200.json", "selection_gpu_h100.json")),
    Entry("sparcml_fig3", "Sparse allreduce on a network (SparCML Fig. 3)", (
        Run("sparcml_fig3.py --procs 8 --density-p 8 --p-density 0.01 --densities 0.01 "
            "--speedup-density 0.01 --rates 200 --repeats 5 --out "
            "benchmarks/results/sparcml_fig3_p8_1pct.json", ("sparcml_fig3_p8_1pct.json",),
            "sparcml_fig3.py --size 64K --procs 2 --density-p 2 --p-density 0.01 --densities "
            "0.01 --speedup-density 0.01 --rates --repeats 2 --warmup 1 --quiet-wait 0 "
            "--out {tmp}/sparcml_fig3_p8_1pct.json", 6, fallback="sparcml_fig3.json"),),
        sparcml_summary),
    Entry("cost_model", "The cost model behind `auto`", (), cost_model_summary, reads=(
        "step_time_headline_mlp.json", "step_time_campaign_h100_p4.json",
        "step_time_campaign_h100_p8.json", "step_time_campaign_h200_p4.json",
        "step_time_campaign_h200_p8.json")),
    Entry("gpu_step", "The sparse step on a GPU", (), gpu_step_summary, reads=(
        "gpu_step_lm_h200.json", "gpu_step_h200_p1.json", "gpu_step_h200_p2.json")),
    Entry("grouping", "Layer grouping", tuple(
        Run(f"grouping.py --models {model} --syncs {sync} --links 200 --procs 2 --pin-cores "
            f"--autogroup-nice -19 --timeout 1800 --rounds 4 --steps {steps} --tag "
            f"{tag}_{sync}_200mbit_p2 {GROUPING_ENV}",
            (f"grouping_{tag}_{sync}_200mbit_p2.json",),
            f"grouping.py --models mlp --syncs {sync} --links shm --procs 2 --rounds 1 "
            f"--steps 1 --warmup 0 --mlp-hidden 64 --out-dir {{tmp}} --tag {tag}_{sync}_200mbit_p2",
            minutes)
        for model, tag, sync, steps, minutes in (("mlp", "mlp", "topk", 2, 2),
                                                 ("cnn", "cnn", "topk", 3, 5),
                                                 ("transformer", "lm", "dense", 2, 20))),
        grouping_summary),
)


# --------------------------------------------------------------------------- status and summaries


def record_status(name: str, results: Path = RESULTS) -> dict:
    """A record's commit and command and whether it is fresh, stale (its measured code
    changed since), unprovenanced or missing."""
    path = results / name
    if not path.exists():
        return {"record": name, "status": "missing"}
    data = load(name, results)
    machine = data.get("machine") if isinstance(data.get("machine"), dict) else {}
    out = {"record": name, "commit": machine.get("commit"), "command": machine.get("command"),
           "png": path.with_suffix(".png").exists()}
    entry = stale_entry(name, data) if results == RESULTS else None
    if entry is None:
        return {**out, "status": "fresh"}
    if "unprovenanced" in entry:
        return {**out, "status": "unprovenanced", "problems": entry["unprovenanced"]}
    return {**out, "status": "stale", "changed": entry["changed"]}


def summarize(entry: Entry, results: Path = RESULTS) -> dict:
    """The entry's summary from the records in ``results`` (the real ones where a quick
    run wrote none), with each record's status."""
    found, names = {}, entry.records_in(results)
    for name in names:
        where = results if (results / name).exists() else RESULTS
        if (where / name).exists():
            found[name] = load(name, where)
    status = [record_status(n, results if (results / n).exists() else RESULTS) for n in names]
    for s in status:  # a fallback says which record it stands in for
        if s["record"] in entry.stand_ins(results):
            s["stands_in_for"] = entry.stand_ins(results)[s["record"]]
    if not found:
        return {"name": entry.name, "title": entry.title, "text": "not measured yet",
                "statistic": "-", "caveats": [], "numbers": {}, "records": status}
    out = entry.summarize(found)
    used = out.pop("used", None)  # a summary may read some of its records only
    if used is not None:
        status = [s for s in status if s["record"] in used]
    return {"name": entry.name, "title": entry.title, **out, "records": status,
            "commands": [r.command for r in entry.runs]}


# --------------------------------------------------------------------------- the pages


def record_cell(status: dict, prefix: str, link: bool) -> str:
    """A record's name (a link on the README), its commit, and what is wrong with it."""
    name = status["record"]
    if status["status"] == "missing":  # named, not cited: there is no file to cite yet
        return f"`{name}` (not measured yet)"
    path = f"{prefix}benchmarks/results/{name}"
    stem = name.rsplit(".", 1)[0]
    cited = f"{stem}.{{json,png}}" if status.get("png") else name  # the plot is cited too
    cell = f"[{name}]({path})" if link else f"`benchmarks/results/{cited}`"
    commit = status.get("commit") or "no commit"
    flag = {"fresh": "", "missing": " (not measured yet)",
            "stale": " (stale: its measured code changed since)",
            "unprovenanced": " (unprovenanced, see the results page)"}[status["status"]]
    if status.get("stands_in_for"):
        flag += f", until `{status['stands_in_for']}` is measured"
    return f"{cell} at {commit}{flag}"


def table(data: dict, prefix: str = "", link: bool = True) -> list[str]:
    """The headline table: one row per entry, the caveats beside the numbers."""
    lines = ["| | headline, as measured | statistic | record, commit |", "| --- | --- | --- | --- |"]
    for i, e in enumerate(data["entries"], 1):
        text = e["text"] + "".join(f" *Caveat: {c}.*" for c in e["caveats"])
        records = "; ".join(record_cell(s, prefix, link) for s in e["records"])
        lines.append(f"| {i}. {e['title']} | {text} | {e['statistic']} | {records} |")
    return lines


def readme_block(data: dict) -> str:
    m = data["machine"]
    return "\n".join([
        f"Written by `python -m benchmarks.headlines` from the records at {m['commit']} "
        f"({m['date'][:10]}); each record names the commit it was measured at and its "
        "command ([results page](docs/results.md): the commands, the stale list). Shared "
        f"{m['cpu_count']}-core CPU VM (emulated links with `tc`) unless a row says GPU.", "",
        *table(data)])


def results_block(data: dict) -> str:
    """The results page's section: the table, every entry's commands, the stale list and
    the unprovenanced records with why each is kept, as of the JSON's commit."""
    m = data["machine"]
    out = ["## Headlines", "",
           f"Written by `python -m benchmarks.headlines` (`benchmarks/results/headlines.json`) at "
           f"{m['commit']}, {m['date'][:10]}: the README's table, the command of every record, "
           "and which records are stale.", "", *table(data, link=False), "",
           "### Commands", "",
           "Each runs from the repository root as `python benchmarks/<script> ...`; "
           "`python -m benchmarks.headlines` runs the stale ones at a clean commit.", ""]
    for e in data["entries"]:
        for cmd in e.get("commands", []):
            out.append(f"- {e['title']}: `{cmd}`")
    out += ["", f"### Stale records at {m['commit']}", "",
            "Records whose measured code (`benchmarks/headlines.py`: `MEASURES` and what each "
            "script imports of the others) changed after the commit they were measured at; "
            "`python -m benchmarks.headlines --stale` prints the current list.", ""]
    stale = [s for s in data["stale"] if "changed" in s]
    out += [f"- `benchmarks/results/{s['record']}` ({s['commit']}): {len(s['changed'])} file(s), "
            f"e.g. `{s['changed'][0]}`" for s in stale] or ["None."]
    out += ["", "### Records without provenance", "",
            "Measured before records named their commit, or on a modified tree; cited, and "
            "too expensive to measure again so far (`UNPROVENANCED` in "
            "`benchmarks/headlines.py`):", ""]
    gone = [s for s in data["stale"] if "unprovenanced" in s]
    out += [f"- `benchmarks/results/{s['record']}`: {s['unprovenanced'][0]}; "
            f"{s.get('why_kept') or 'not listed'}" for s in gone] or ["None."]
    return "\n".join(out)


def replace_block(text: str, block: str, path) -> str:
    """``text`` with what lies between :data:`MARKERS` replaced by ``block``."""
    begin, end = MARKERS
    if begin not in text or end not in text:
        raise SystemExit(f"{path}: the markers {begin!r} ... {end!r} are missing")
    head_, rest = text.split(begin, 1)
    return f"{head_}{begin}\n{block}\n{end}{rest.split(end, 1)[1]}"


def write_pages(data: dict, readme: Path = README, page: Path = RESULTS_PAGE) -> None:
    readme.write_text(replace_block(readme.read_text(), readme_block(data), readme))
    page.write_text(replace_block(page.read_text(), results_block(data), page))
    print(f"wrote {readme} and {page}", flush=True)


# --------------------------------------------------------------------------- running


def why_run(run: Run, heavy: bool, force: bool) -> tuple[bool, str]:
    """Whether to run ``run`` now, and why (or why its records are reused)."""
    if run.where == "gpu":
        return False, "measured on a GPU host (scripts/gpu_session.sh); reused"
    if run.heavy and not heavy:
        return False, f"heavy (~{run.minutes:.0f} min of training): run with --heavy"
    if force:
        return True, "--force"
    for name in run.writes:
        status = record_status(name)
        if status["status"] == "missing":
            return True, f"{name} is missing"
        if status["status"] == "unprovenanced":
            return True, f"{name}: {status['problems'][0]}"
        if status["status"] == "stale":
            return True, f"{name}: {len(status['changed'])} measured file(s) changed since " \
                         f"{status['commit']} ({status['changed'][0]}, ...)"
    commits = ", ".join(sorted({str(record_status(n)['commit']) for n in run.writes}))
    return False, f"reused: measured at {commits}, its measured code unchanged since (git diff)"


def argv_of(command: str, tmp: Path | None = None) -> list[str]:
    """``python benchmarks/<script> <args>`` of a command (``{tmp}`` filled in)."""
    parts = shlex.split(command.replace("{tmp}", str(tmp)) if tmp else command)
    return [sys.executable, str(Path("benchmarks") / parts[0]), *parts[1:]]


def run_locked(argv: list[str], lock: bool, env: dict | None = None) -> int:
    """``argv`` from the repository root, holding the measurement lock if ``lock``; its
    exit status."""
    with open(MEASURE_LOCK, "a") as f:
        if lock:
            fcntl.flock(f, fcntl.LOCK_EX)
        return subprocess.run(argv, cwd=ROOT, env=env).returncode


def execute(command: str, lock: bool, tmp: Path | None = None) -> float:
    """Runs one command from the repository root (holding the measurement lock unless the
    script takes it itself); its wall seconds. A failure ends the command."""
    argv = argv_of(command, tmp)
    print(f"\n$ {shlex.join(argv[1:])}", flush=True)
    t0 = time.monotonic()
    rc = run_locked(argv, lock and tmp is None)
    if rc != 0:
        raise SystemExit(f"headlines: `{command}` exited with {rc}")
    return time.monotonic() - t0


def build(results: Path = RESULTS, ran: dict | None = None, wall_s: float = 0.0) -> dict:
    """headlines.json: every entry's summary and record status, the stale list and the
    unprovenanced records, stamped with this commit and command."""
    from _harness import machine_info

    # less headlines.json itself: this build rewrites it at this commit
    stale = stale_list([n for n in record_names() if n != OUT.name]) if results == RESULTS else []
    return {"benchmark": "headlines", "machine": machine_info(mpi=False),
            "entries": [summarize(e, results) for e in HEADLINES], "stale": stale,
            "ran": ran or {}, "wall_s": round(wall_s, 1)}


def quick(only) -> Path:
    """Every entry's tiny run into a temporary folder, checked: each record names its
    command exactly as run; the pages rendered there from its summaries."""
    tmp = Path(tempfile.mkdtemp(prefix="jss_headlines_"))
    for entry in HEADLINES:
        if only and entry.name not in only:
            continue
        for run in entry.runs:
            if not run.quick:
                print(f"# {entry.name}: no quick run of `{run.command.split()[0]}`", flush=True)
                continue
            execute(run.quick, lock=False, tmp=tmp)
            for name in run.writes:
                got = load(name, tmp)["machine"]["command"]
                want = " ".join(shlex.split(run.quick.replace("{tmp}", str(tmp))))
                if got != want:
                    raise SystemExit(f"headlines: {name} records the command {got!r}, "
                                     f"not {want!r} as run")
    data = build(tmp)
    (tmp / "README.md").write_text(readme_block(data) + "\n")
    (tmp / "results.md").write_text(results_block(data) + "\n")
    print(readme_block(data), flush=True)
    return tmp


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="+", metavar="ENTRY", choices=[e.name for e in HEADLINES])
    ap.add_argument("--quick", action="store_true", help="every entry at a tiny size (temp dir)")
    ap.add_argument("--dry-run", action="store_true", help="say what would run, and why")
    ap.add_argument("--write", action="store_true", help="no runs: the pages from the records")
    ap.add_argument("--stale", action="store_true", help="print the stale list and exit")
    ap.add_argument("--render", action="store_true",
                    help="only rewrite the pages from benchmarks/results/headlines.json")
    ap.add_argument("--heavy", action="store_true", help="also the runs that train for hours")
    ap.add_argument("--force", action="store_true", help="run even what is fresh")
    args = ap.parse_args(argv)
    if args.stale:
        for s in stale_list():
            why = s.get("unprovenanced") or [f"{len(s['changed'])} changed: "
                                             + ", ".join(s["changed"][:4])]
            print(f"{s['record']:48s} {str(s['commit']):20s} {why[0]}")
        return 0
    if args.quick:
        print(f"# quick run in {quick(args.only)}")
        return 0
    if args.render:  # e.g. into a checkout where others' changes are under way
        write_pages(json.loads(OUT.read_text()))
        return 0
    dirty = dirty_paths()
    if dirty and not args.dry_run:
        raise SystemExit(f"headlines: the tree has changes ({', '.join(dirty[:5])}); a record "
                         "must name a commit: commit or stash them, or run in a clean "
                         "worktree (git worktree add)")
    ran, t0 = {}, time.monotonic()
    for entry in HEADLINES:
        for run in entry.runs:
            go, why = why_run(run, args.heavy, args.force) if not args.write else (False, "--write")
            go = go and (not args.only or entry.name in args.only)
            print(f"# {entry.name}: {'RUN' if go else 'skip'} {run.command.split()[0]} "
                  f"({why})", flush=True)
            if go and not args.dry_run:
                ran[run.command] = round(execute(run.command, run.lock), 1)
    if args.dry_run:
        return 0
    data = build(RESULTS, ran, time.monotonic() - t0)
    from _harness import write_record

    write_record(data, OUT)
    write_pages(data)
    print(f"rewrote the tables {', '.join(doc_tables.write_all()) or '(none changed)'}")
    for s in data["stale"]:
        print(f"stale: {s['record']} ({s.get('unprovenanced', s.get('changed'))[0]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
