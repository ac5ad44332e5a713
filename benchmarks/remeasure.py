"""Re-measure the stale records by their own commands, at a clean commit.

Every record names the command it was measured by (``machine.command``). For the records
on the stale list (``python -m benchmarks.headlines --stale``), this replays the commands
that can be replayed as recorded, the cheapest first (by the record's ``wall_s``) until a
time budget is spent, each holding the measurement lock; then it checks that each run
rewrote its record at this commit, and says for every other stale record why it was not
run (a GPU host, training runs, a path outside the repository, no command).

    python -m benchmarks.remeasure --dry-run             # the plan, and what is left out and why
    python -m benchmarks.remeasure --max-minutes 60      # run what fits in an hour
    python -m benchmarks.remeasure --only 'oktopk_*'     # records matching a pattern
    python -m benchmarks.remeasure --training --only convergence_cnn.json   # re-train one

Run it in a clean worktree at the commit to measure (``git worktree add``), then copy the
records back; the docs' tables follow with ``python -m benchmarks.doc_tables``.
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
import headlines  # noqa: E402  (the stale list, the measured paths, the runner)

#: environment a record's command was run with, which ``machine.command`` does not hold
#: (from the docs that state them)
REPLAY_ENV = {
    "oktopk_hash_partition_time_p2.json": {
        "JAX_PLATFORMS": "cpu", "JSS_NUM_THREADS": "1", "MPIR_CVAR_CH4_PROGRESS_THROTTLE": "1",
        "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false"},
    "allreduce_shm.json": {"JSS_TUNE_HOST_ALLOCATOR": "0"},
    "allreduce_shm_tuned_malloc.json": {"JSS_TUNE_HOST_ALLOCATOR": "0"},
}
REPLAY_ENV["oktopk_hash_partition_time_p4.json"] = REPLAY_ENV["oktopk_hash_partition_time_p2.json"]
#: records whose script ran under an outer ``mpiexec -n P`` (the record does not hold P)
OUTER_MPIEXEC = {"wire_formats_p4.json": 4}
#: what a script that launches its own ranks calls: mpiexec, or the harness's launchers
#: (``_harness.launch_worker``, ``EmulatedNetwork.launch``: faults.py, calibration_stability.py)
LAUNCHERS = re.compile(r"mpiexec|\blaunch_worker\b|\.\s*launch\s*\(")
#: the records built from training runs, which ``--training`` re-trains by their own
#: ``machine.command`` (``convergence.py``), and the minutes each takes on the 2-core machine
#: alone (measured: the first three at e0482ea; at bf6b51a the 600-step ones, 40 beside a CI
#: run and 81 alone, and the leak's; the other P = 8 ones estimated). Their commands keep one
#: ``--work-dir`` per step count under build/ and ``--resume``, so a run two records share
#: trains once, and ``--timeout`` above the P = 8 600-step run's 2434 s (tests/test_remeasure.py).
#: ``--training`` runs them niced (:func:`lower_autogroups`), without the measurement lock:
#: training is not timed. A re-made record has no emulated time axis (``convergence.py
#: --step-times`` left out; no page quotes the old records' one), and one that misses a mode
#: of its command counts as failed (``convergence.py`` rewrites the record after every run).
TRAINING_MINUTES = {
    "convergence_cnn_shared_support.json": 10,
    "convergence_cnn.json": 36,
    "convergence_lm.json": 40,
    "convergence_lm_steps600.json": 40,
    "convergence_lm_variants_P8.json": 105,
    "convergence_lm_union_P8.json": 80,
    "convergence_lm_leak_P8.json": 110,  # 73 for the 6 of its 9 modes it trained
    "convergence_lm_lrin_meanvwarm_P8.json": 105,
    "convergence_lm_steps600_meanv_P8.json": 81,
}
#: minutes assumed for a record that does not say how long it took
UNKNOWN_MINUTES = 5.0


@dataclass(frozen=True)
class Replay:
    command: str  # as recorded: ``<script> <args>``, run from the repository root
    records: tuple[str, ...]  # the stale records it rewrites
    minutes: float | None  # as the records took, None: unknown
    env: dict  # REPLAY_ENV's and the command's own ``NAME=value`` assignments
    training: bool = False  # training runs (TRAINING_MINUTES): niced, without the lock

    @cached_property  # parsed once (a frozen dataclass still has its __dict__)
    def tokens(self) -> list[str]:
        """The command's tokens after its assignments (which are in ``env``)."""
        return split_command(self.command)[1]


def recorded_minutes(data: dict) -> float | None:
    wall = data.get("wall_s")
    if isinstance(wall, dict):
        wall = sum(v for v in wall.values() if isinstance(v, (int, float)))
    return wall / 60 if isinstance(wall, (int, float)) and wall > 0 else None


def split_command(command: str) -> tuple[dict, list[str]]:
    """(the command's leading ``NAME=value`` assignments, the rest's tokens)."""
    tokens = shlex.split(command)
    env = {}
    while tokens and re.fullmatch(r"[A-Za-z_]\w*=.*", tokens[0]):
        key, value = tokens.pop(0).split("=", 1)
        env[key] = value
    return env, tokens


def shell_script(tokens: list[str]) -> bool:
    """Whether the command runs one of the repository's scripts/ (``bash scripts/x.sh ...``,
    as scripts/fuzz.sh's ``measure`` records itself)."""
    return (len(tokens) > 1 and tokens[0] == "bash" and tokens[1].startswith("scripts/")
            and tokens[1].endswith(".sh") and (headlines.ROOT / tokens[1]).is_file())


def command_of(data: dict) -> str | None:
    """The command that re-makes a record: its own (``machine.command``)."""
    command = ((data.get("machine") or {}) if isinstance(data, dict) else {}).get("command")
    return command if isinstance(command, str) and command.strip() else None


def why_not(name: str, data: dict, training: bool = False) -> str | None:
    """Why a stale record's command cannot be replayed as recorded (None: it can)."""
    if name == headlines.OUT.name:
        return "the headlines' summary: python -m benchmarks.headlines --write"
    command = command_of(data)
    if command is None:
        return "no recorded command"
    if name in TRAINING_MINUTES:
        return None if training else (
            f"training runs: --training re-trains it (about {TRAINING_MINUTES[name]} min)")
    if "ffi/cuda" in headlines.measured_paths(name):
        return "measured on a GPU host: scripts/gpu_session.sh campaign"
    if any(fnmatch.fnmatch(name, p) for p in headlines.TRAINED):
        return "built from training runs: their own --work-dir (headlines.py --heavy, the docs)"
    try:
        env, tokens = split_command(command)
    except ValueError:
        return "its command does not parse"
    if shell_script(tokens):
        return outside_path(tokens, env)
    if not tokens:
        return "its command names no script (only environment assignments)"
    if not tokens[0].endswith(".py") or not (HERE / tokens[0]).is_file():
        return f"its command does not start with a script in benchmarks/ ({tokens[0]})"
    if "--worker" in tokens:
        return "the command of one of its workers, not of the script"
    if runs_under_mpiexec(tokens[0]) and name not in OUTER_MPIEXEC:
        return ("its script runs under an outer mpiexec whose rank count the record does not "
                "hold: run it by hand (or add it to OUTER_MPIEXEC)")
    return outside_path(tokens, env)


def outside_path(tokens: list[str], env: dict | None = None) -> str | None:
    """The first absolute path among a command's arguments and assignments, said."""
    outside = [t for t in (*tokens[1:], *(env or {}).values()) for p in t.split("=")
               if p.startswith("/")]
    if outside:
        return f"its command names a path outside the repository ({outside[0]}): run it by hand"
    return None


def runs_under_mpiexec(script: str) -> bool:
    """Whether a script uses MPI's world without launching ranks itself: it ran under
    ``mpiexec -n P``, which ``machine.command`` does not show (run alone it would measure
    one rank, and write the record of P)."""
    text = (HERE / script).read_text()
    code = headlines.code_text(text, script)
    return ("mpi4py" in code or "COMM_WORLD" in code) and "COMM_SELF" not in code \
        and not LAUNCHERS.search(headlines.code_text(text, script, strings=False))


def plan(stale: list[dict], only: list[str] | None = None, results: Path | None = None,
         training: bool = False):
    """(the replays, cheapest first; {record: why it is left out}) for the stale entries;
    ``training`` adds the records built from training runs (:data:`TRAINING_MINUTES`)."""
    results = results or headlines.RESULTS
    by_command: dict[str, list] = {}
    left_out = {}
    for entry in stale:
        name = entry["record"]
        if only and not any(fnmatch.fnmatch(name, p) for p in only):
            continue
        data = headlines.load(name, results)
        why = why_not(name, data, training)
        if why is not None:
            left_out[name] = why
            continue
        by_command.setdefault(command_of(data), []).append((name, data))
    replays = []
    for command, named in by_command.items():
        minutes = [TRAINING_MINUTES.get(n) or recorded_minutes(d) for n, d in named]
        # what the command itself assigns wins over what the docs state (REPLAY_ENV)
        env = {**{k: v for n, _ in named for k, v in REPLAY_ENV.get(n, {}).items()},
               **split_command(command)[0]}
        replays.append(Replay(command, tuple(n for n, _ in named),
                              max(m for m in minutes) if None not in minutes else None, env,
                              training=any(n in TRAINING_MINUTES for n, _ in named)))
    replays.sort(key=lambda r: (r.minutes is None, r.minutes or 0.0, r.command))
    return replays, left_out


def within_budget(replays: list[Replay], max_minutes: float | None) -> list[Replay]:
    """The replays, in order, that fit in ``max_minutes`` (unknown ones count
    :data:`UNKNOWN_MINUTES`)."""
    if max_minutes is None:
        return list(replays)
    out, total = [], 0.0
    for r in replays:
        cost = r.minutes if r.minutes is not None else UNKNOWN_MINUTES
        if total + cost <= max_minutes:
            out.append(r)
            total += cost
    return out


def command_modes(command: str) -> list[str]:
    """The ``--modes`` of a convergence.py command."""
    tokens = shlex.split(command)
    if "--modes" not in tokens:
        return []
    rest = tokens[tokens.index("--modes") + 1:]
    return rest[:next((i for i, t in enumerate(rest) if t.startswith("--")), len(rest))]


def missing_modes(name: str, replay: Replay, results: Path | None = None) -> list[str]:
    """The modes of a training replay's command that its record does not hold (a run that
    failed or timed out: convergence.py rewrites the record after every run)."""
    if not replay.training:
        return []
    data = headlines.load(name, results or headlines.RESULTS)
    held = {row["mode"] for row in data.get("table", [])}
    return [m for m in command_modes(replay.command) if m not in held]


def rewritten(name: str, commit: str) -> bool:
    """Whether ``name`` now names ``commit`` (the run wrote it here)."""
    path = headlines.RESULTS / name
    return path.exists() and (headlines.load(name, headlines.RESULTS).get("machine") or {}).get(
        "commit") == commit


def takes_lock(tokens: list[str]) -> bool:
    """Whether a command's script (its tokens after the assignments) takes the measurement
    lock itself (its ``--lock``): holding it here too would keep it waiting for ever."""
    if shell_script(tokens):
        return False
    return 'add_argument("--lock"' in (HERE / tokens[0]).read_text()


def argv_of(replay: Replay) -> list[str]:
    """The replay's command line: ``python benchmarks/<script> <args>``, under
    ``mpiexec -n P`` where its script ran under one (:data:`OUTER_MPIEXEC`)."""
    tokens = replay.tokens
    if shell_script(tokens):  # its environment assignments are in replay.env
        return tokens
    argv = headlines.argv_of(shlex.join(tokens))
    if replay.training:
        return ["nice", "-n", "19", *argv]
    ranks = {OUTER_MPIEXEC[n] for n in replay.records if n in OUTER_MPIEXEC}
    if ranks:
        mpiexec = str(Path(sys.executable).parent / "mpiexec")
        argv = [mpiexec, "-n", str(ranks.pop()), argv[0], "-m", "mpi4py", *argv[1:]]
    return argv


def descendants(pid: int, proc: Path = Path("/proc")) -> list[int]:
    """The live descendants of ``pid``, from each process's parent in ``/proc/<pid>/stat``."""
    children: dict[int, list[int]] = {}
    for stat in proc.glob("[0-9]*/stat"):
        try:  # the fields after the command's closing parenthesis: state, ppid, ...
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # it ended meanwhile
        children.setdefault(ppid, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def lower_autogroups(pid: int, nice: int = 19, proc: Path = Path("/proc")) -> int:
    """Sets ``nice`` on the scheduling autogroup of every descendant of ``pid`` that sits in
    another autogroup than this process; how many groups it set. mpiexec's proxy and ranks
    each call setsid, and Linux schedules sessions (autogroups) against each other before
    a process's own nice counts: under ``nice -n 19`` each of P training ranks would still
    weigh as much as a whole other session (a CI run, a timing job)."""
    def group(p) -> str | None:
        try:
            return (proc / str(p) / "autogroup").read_text().split()[0]
        except (OSError, IndexError):
            return None
    own, done = group("self"), set()
    for child in descendants(pid, proc):
        g = group(child)
        if g is not None and g != own and g not in done:
            try:
                (proc / str(child) / "autogroup").write_text(str(nice))
                done.add(g)
            except OSError:
                pass
    return len(done)


def run_training(argv: list[str], env: dict, every_s: float = 10.0) -> int:
    """A training replay, its ranks' autogroups lowered while it runs (:func:`lower_autogroups`:
    each new run's ranks get a new session); its exit status."""
    proc = subprocess.Popen(argv, cwd=headlines.ROOT, env=env)
    while True:
        lower_autogroups(proc.pid)
        try:
            return proc.wait(every_s)
        except subprocess.TimeoutExpired:
            continue


def run(replay: Replay) -> None:
    """One replay from the repository root, holding the measurement lock unless its script
    takes it itself (a training replay: none, niced down to its ranks' autogroups); a
    failure raises SystemExit."""
    argv = argv_of(replay)
    print(f"\n$ {shlex.join(argv)}", flush=True)
    env = {**os.environ, **replay.env}
    if replay.training:
        rc = run_training(argv, env)
    else:
        rc = headlines.run_locked(argv, not takes_lock(replay.tokens), env)
    if rc != 0:
        raise SystemExit(f"remeasure: `{replay.command}` exited with {rc}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    ap.add_argument("--max-minutes", type=float, default=None,
                    help="start no replay past this many minutes (by the records' wall_s)")
    ap.add_argument("--only", nargs="+", metavar="PATTERN", help="record names (fnmatch)")
    ap.add_argument("--training", action="store_true",
                    help="also re-train the records built from training runs (TRAINING_MINUTES; "
                         "10 min to 2 h each)")
    args = ap.parse_args(argv)
    replays, left_out = plan(headlines.stale_list(), args.only, training=args.training)
    chosen = within_budget(replays, args.max_minutes)
    for r in replays:
        mins = "?" if r.minutes is None else f"{r.minutes:.1f}"
        env = " ".join(f"{k}={v}" for k, v in r.env.items())
        print(f"{'RUN ' if r in chosen else 'over budget'} ~{mins} min: {', '.join(r.records)}"
              f"\n    {env + ' ' if env else ''}{shlex.join(argv_of(r))}", flush=True)
    for name, why in sorted(left_out.items()):
        print(f"left out: {name}: {why}")
    if args.dry_run:
        return 0
    if dirty := headlines.dirty_paths():
        raise SystemExit(f"remeasure: the tree has changes ({', '.join(dirty[:5])}); a record "
                         "must name a commit: run in a clean worktree")
    commit, failed = headlines.head(), []
    for r in chosen:
        try:
            run(r)
        except SystemExit as e:  # one failed command does not end the others
            print(f"failed: {e}", flush=True)
            failed += list(r.records)  # what it wrote before failing is not a record
            continue
        failed += [n for n in r.records if not rewritten(n, commit) or missing_modes(n, r)]
    still = {s["record"] for s in headlines.stale_list()}
    done = [n for r in chosen for n in r.records if n not in still]
    print(f"fresh now ({len(done)}): {', '.join(done) or '-'}")
    if failed:
        print(f"ran, but not rewritten at {commit}: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
