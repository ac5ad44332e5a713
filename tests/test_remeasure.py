"""Re-measuring the stale records by their own commands (benchmarks/remeasure.py)."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import headlines  # noqa: E402
import remeasure  # noqa: E402


def record(command=None, wall_s=None, commit="abc123"):
    data = {"machine": {"commit": commit}}
    if command is not None:
        data["machine"]["command"] = command
    if wall_s is not None:
        data["wall_s"] = wall_s
    return data


@pytest.mark.parametrize("name, command, why", [
    ("selection_cpu.json", None, "no recorded command"),
    ("gpu_step_x.json", "gpu_step.py --sizes 1M", "GPU host"),
    ("convergence_x.json", "convergence.py --models cnn", "training runs"),
    ("selection_cpu.json", "selection.py --out /tmp/x.json", "outside the repository (/tmp/x.json)"),
    ("selection_cpu.json", "selection.py --out=/tmp/x.json", "outside the repository"),
    ("hash_partition_time_x.json", "hash_partition_time.py --worker --size 4M", "workers"),
    ("fuzz_runs.json", "JSS_FUZZ_MAX_TIME=1 bash scripts/nope.sh", "script in benchmarks/"),
    ("fuzz_runs.json", "bash scripts/fuzz.sh measure --out /tmp/f.json", "outside the repository"),
    ("fuzz_runs.json", "JSS_FUZZ_RECORD=/tmp/f.json bash scripts/fuzz.sh measure", "(/tmp/f.json)"),
    ("selection_cpu.json", "JSS_NUM_THREADS=1", "names no script"),
    ("headlines.json", "headlines.py --write", "headlines --write"),
])
def test_what_cannot_be_replayed_says_why(name, command, why):
    assert why in remeasure.why_not(name, record(command))


def test_a_plain_command_is_replayed():
    assert remeasure.why_not("selection_cpu.json", record("selection.py --quiet-wait 20")) is None


def test_the_plan_runs_each_command_once_cheapest_first(tmp_path):
    files = {"selection_cpu.json": record("selection.py --quiet-wait 20", 600.0),
             "selection_cpu_reuse.json": record("selection.py --quiet-wait 20", 300.0),
             "compression_cpu.json": record("compression.py", 120.0),
             "wire_formats_p4.json": record("wire_formats.py"),
             "gpu_step_h1.json": record("gpu_step.py"),
             "oktopk_volume.json": record("oktopk_volume.py --sweep", {"2": 60.0, "3": 60.0})}
    for name, data in files.items():
        (tmp_path / name).write_text(json.dumps(data))
    stale = [{"record": n} for n in files]
    replays, left_out = remeasure.plan(stale, results=tmp_path)
    assert [r.command for r in replays] == ["compression.py", "oktopk_volume.py --sweep",
                                             "selection.py --quiet-wait 20", "wire_formats.py"]
    assert replays[1].minutes == pytest.approx(2.0)
    assert replays[2].records == ("selection_cpu.json", "selection_cpu_reuse.json")
    assert replays[2].minutes == pytest.approx(10.0) and replays[3].minutes is None
    assert list(left_out) == ["gpu_step_h1.json"]
    assert [r.command for r in remeasure.within_budget(replays, 4.0)] == [
        "compression.py", "oktopk_volume.py --sweep"]
    assert [r.command for r in remeasure.within_budget(replays, 9.0)] == [
        "compression.py", "oktopk_volume.py --sweep", "wire_formats.py"]  # unknown: 5 min
    only, _ = remeasure.plan(stale, ["selection_*"], results=tmp_path)
    assert [r.records for r in only] == [("selection_cpu.json", "selection_cpu_reuse.json")]


def test_the_environment_a_command_needs_goes_with_it(tmp_path):
    name = "oktopk_hash_partition_time_p2.json"
    (tmp_path / name).write_text(json.dumps(record("hash_partition_time.py --size 4M")))
    (replay,), _ = remeasure.plan([{"record": name}], results=tmp_path)
    assert replay.env["JSS_NUM_THREADS"] == "1"


def test_a_shell_script_of_the_repository_is_replayed_with_its_environment(tmp_path):
    """scripts/fuzz.sh's ``measure`` records ``JSS_FUZZ_MAX_TIME='150' bash scripts/fuzz.sh
    measure ...``: replayed as that, the assignment in its environment."""
    name = "fuzz_runs.json"
    command = "JSS_FUZZ_MAX_TIME='150' bash scripts/fuzz.sh measure 10000000 2"
    assert remeasure.why_not(name, record(command)) is None
    (tmp_path / name).write_text(json.dumps(record(command)))
    (replay,), left_out = remeasure.plan([{"record": name}], results=tmp_path)
    assert not left_out and replay.env == {"JSS_FUZZ_MAX_TIME": "150"}
    assert remeasure.argv_of(replay) == ["bash", "scripts/fuzz.sh", "measure", "10000000", "2"]
    assert not remeasure.takes_lock(replay.tokens)


def test_a_python_command_with_assignments_runs_its_script_with_them(tmp_path):
    name = "selection_cpu.json"
    (tmp_path / name).write_text(json.dumps(record("JSS_NUM_THREADS=1 selection.py --size 1M")))
    (replay,), _ = remeasure.plan([{"record": name}], results=tmp_path)
    assert replay.env == {"JSS_NUM_THREADS": "1"}
    assert remeasure.argv_of(replay)[1:] == ["benchmarks/selection.py", "--size", "1M"]


def test_a_script_run_under_an_outer_mpiexec_is_replayed_under_one(tmp_path):
    """wire_formats.py ran as `mpiexec -n 4 ... wire_formats.py`; its record holds only
    `wire_formats.py`: replayed alone it would time one rank and write the P = 4 record."""
    assert remeasure.runs_under_mpiexec("wire_formats.py")
    assert remeasure.runs_under_mpiexec("shared_support_time.py")
    # their ranks come from launch_worker / EmulatedNetwork.launch, not an outer mpiexec
    for script in ("update_profile.py", "adam_fused.py", "dense_allreduce.py", "selection.py",
                   "faults.py", "calibration_stability.py"):
        assert not remeasure.runs_under_mpiexec(script), script
    assert "outer mpiexec" in remeasure.why_not("wire_formats_p8.json", record("wire_formats.py"))
    # a launcher named in a string or a comment launches nothing
    said = headlines.code_text('h = "run under mpiexec -n 4"  # or launch_worker(...)\n', "x.py",
                               strings=False)
    assert not remeasure.LAUNCHERS.search(said)
    assert "mpiexec" in headlines.code_text('h = "run under mpiexec -n 4"\n', "x.py")
    assert remeasure.LAUNCHERS.search(headlines.code_text("launch_worker(args)\n", "x.py",
                                                          strings=False))
    name = "wire_formats_p4.json"
    (tmp_path / name).write_text(json.dumps(record("wire_formats.py --size 1M")))
    (replay,), _ = remeasure.plan([{"record": name}], results=tmp_path)
    argv = remeasure.argv_of(replay)
    assert argv[0].endswith("mpiexec") and argv[1:3] == ["-n", "4"]
    assert argv[4:] == ["-m", "mpi4py", "benchmarks/wire_formats.py", "--size", "1M"]


def test_scripts_that_take_the_lock_are_not_run_under_it():
    assert remeasure.takes_lock(["time_to_accuracy.py", "--model", "lm"])
    assert remeasure.takes_lock(["sparse_allreduce_host.py", "--sweep"])
    assert not remeasure.takes_lock(["selection.py", "--quiet-wait", "20"])


def test_a_run_that_does_not_rewrite_its_record_fails(tmp_path, monkeypatch):
    """main() runs the chosen replays and checks each rewrote its record at HEAD."""
    commands = {"compression_cpu.json": "compression.py", "wire_formats_p4.json": "wire_formats.py"}
    for name, command in commands.items():
        (tmp_path / name).write_text(json.dumps(record(command, 60.0)))
    monkeypatch.setattr(remeasure.headlines, "RESULTS", tmp_path)
    monkeypatch.setattr(remeasure.headlines, "dirty_paths", lambda: [])
    monkeypatch.setattr(remeasure.headlines, "head", lambda: "feedbeef")
    monkeypatch.setattr(remeasure.headlines, "stale_list", lambda: [
        {"record": n} for n in commands
        if json.loads((tmp_path / n).read_text())["machine"]["commit"] != "feedbeef"])
    ran = []

    def fake_run(replay):  # the compression script rewrites its record; wire_formats does not
        ran.append(replay.command)
        if replay.command == "compression.py":
            (tmp_path / "compression_cpu.json").write_text(json.dumps(record("x", 1, "feedbeef")))
    monkeypatch.setattr(remeasure, "run", fake_run)
    assert remeasure.main([]) == 1
    assert ran == ["compression.py", "wire_formats.py"]
    (tmp_path / "wire_formats_p4.json").write_text(json.dumps(record("x", 1, "feedbeef")))
    assert remeasure.main([]) == 0 and ran == ["compression.py", "wire_formats.py"]


def test_the_dry_run_plans_the_real_stale_list():
    proc = subprocess.run([sys.executable, "-m", "benchmarks.remeasure", "--dry-run"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert all(line.startswith(("RUN", "over budget", "    ", "left out: ")) for line in lines)


def test_training_records_are_retrained_only_when_asked(tmp_path):
    """TRAINING_MINUTES: the records built from training runs are left out, saying how to
    re-train them; with training=True their own command runs niced, without the lock."""
    name = "convergence_cnn.json"
    command = own_command(name)
    (tmp_path / name).write_text(json.dumps(record(command)))
    replays, left_out = remeasure.plan([{"record": name}], results=tmp_path)
    assert not replays and "--training re-trains it" in left_out[name]
    (replay,), left_out = remeasure.plan([{"record": name}], results=tmp_path, training=True)
    assert not left_out and replay.training and replay.records == (name,)
    assert replay.command == command and replay.minutes == remeasure.TRAINING_MINUTES[name]
    argv = remeasure.argv_of(replay)
    assert argv[:3] == ["nice", "-n", "19"] and argv[4] == "benchmarks/convergence.py"
    (tmp_path / name).write_text(json.dumps({"table": []}))  # no machine entry: nothing to run
    _, left_out = remeasure.plan([{"record": name}], results=tmp_path, training=True)
    assert left_out[name] == "no recorded command"


def own_command(name: str) -> str:
    return json.loads((ROOT / "benchmarks" / "results" / name).read_text())["machine"]["command"]


def test_every_training_record_holds_a_command_convergence_py_accepts():
    """Each training record's own command parses with convergence.py's own parser, names
    modes it has, writes the record it re-makes, and keeps a step count to its own work
    directory inside the repository (runs two records share train once, by --resume)."""
    import convergence

    work_dirs = {}
    for name, minutes in remeasure.TRAINING_MINUTES.items():
        script, *rest = remeasure.shlex.split(own_command(name))
        assert script == "convergence.py" and minutes > 0, name
        args = convergence.parse_args(rest)
        assert set(args.modes) <= set(convergence.MODES), (name, set(args.modes) - set(convergence.MODES))
        (model,) = args.models
        out = f"convergence_{model}" + (f"_{args.tag}" if args.tag else "") + (
            f"_P{args.procs}" if args.procs != 4 else "") + ".json"
        assert out == name, (out, name)
        assert args.resume and args.timeout > 2434, name  # the P = 8 600-step run's seconds
        assert not args.work_dir.startswith("/"), name  # replayable: inside the repository
        work_dirs.setdefault(args.work_dir, set()).add(args.steps)
    assert all(len(steps) == 1 for steps in work_dirs.values()), work_dirs


def test_a_training_record_that_misses_a_mode_of_its_command_is_not_fresh(tmp_path):
    name = "convergence_cnn.json"
    command = own_command(name)
    modes = remeasure.command_modes(command)
    assert modes[0] == "dense" and len(modes) == 12 and not any(m.startswith("--") for m in modes)
    replay = remeasure.Replay(command, (name,), 70, {}, training=True)
    (tmp_path / name).write_text(json.dumps({"table": [{"mode": m} for m in modes[:-1]]}))
    assert remeasure.missing_modes(name, replay, tmp_path) == modes[-1:]
    (tmp_path / name).write_text(json.dumps({"table": [{"mode": m} for m in modes]}))
    assert remeasure.missing_modes(name, replay, tmp_path) == []


def fake_proc(tmp_path, procs: dict) -> Path:
    """A /proc of ``{pid: (ppid, autogroup)}`` (pid "self": this process's group)."""
    for pid, (ppid, group) in procs.items():
        d = tmp_path / str(pid)
        d.mkdir()
        if pid != "self":
            (d / "stat").write_text(f"{pid} (py (x)) S {ppid} {pid} {pid} 0")
        (d / "autogroup").write_text(f"/autogroup-{group} nice 0\n")
    return tmp_path


def test_lower_autogroups_sets_each_other_group_of_the_descendants_once(tmp_path):
    """A training replay's ranks each sit in their own session (mpiexec's setsid): each
    such group below the replay is set to nice 19 once; this process's own group, an
    unrelated process's and the parent's are left alone."""
    proc = fake_proc(tmp_path, {"self": (0, 1), 100: (1, 1), 101: (100, 1), 102: (101, 7),
                                103: (102, 8), 104: (102, 9), 105: (104, 9), 200: (1, 5)})
    assert sorted(remeasure.descendants(100, proc)) == [101, 102, 103, 104, 105]
    assert remeasure.lower_autogroups(100, 19, proc) == 3
    text = {p: (proc / str(p) / "autogroup").read_text() for p in (100, 101, 102, 103, 104, 105, 200)}
    assert [p for p, t in text.items() if t == "19"] == [102, 103, 104]  # groups 7, 8, 9 once each
    assert all(text[p].endswith("nice 0\n") for p in (100, 101, 105, 200))


@pytest.mark.skipif(not Path("/proc/self/autogroup").exists(), reason="no scheduler autogroups")
def test_lower_autogroups_lowers_a_real_setsid_child():
    parent = subprocess.Popen(["sh", "-c", "setsid sleep 60 & wait"])
    try:
        for _ in range(200):  # until setsid has run and exec'd sleep
            kids = [k for k in remeasure.descendants(parent.pid)
                    if Path(f"/proc/{k}/cmdline").read_bytes().startswith(b"sleep")]
            if kids:
                break
            time.sleep(0.05)
        assert kids, "the setsid child did not start"
        if remeasure.lower_autogroups(parent.pid) == 0:
            pytest.skip("this user may not set autogroup nice values")
        assert Path(f"/proc/{kids[0]}/autogroup").read_text().split()[-1] == "19"
    finally:
        for kid in remeasure.descendants(parent.pid):
            subprocess.run(["kill", str(kid)])
        parent.wait(10)


def test_a_training_replay_returns_its_exit_status():
    assert remeasure.run_training([sys.executable, "-c", "raise SystemExit(3)"], {}, 0.05) == 3
