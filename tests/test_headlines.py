"""The README's headlines and the records behind them (benchmarks/headlines.py).

Every JSON record in benchmarks/results names the commit it was measured at (an ancestor
of HEAD, never ``+dirty``) and its command, and a record built from training runs names
the commit each run trained at; the records that cannot, and are kept, are listed in
``UNPROVENANCED`` with why. The README's headline table and the results page's section
are ``headlines.json`` rendered, and ``headlines.json`` is the records summarized: a
number on either page cannot differ from its record. ``--quick`` runs two entries
end to end (the others' tiny runs take minutes here).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import headlines  # noqa: E402

if subprocess.run(["git", "rev-parse", "--git-dir"], cwd=ROOT, capture_output=True).returncode:
    pytest.skip("not a git checkout: records name commits of its history", allow_module_level=True)
#: a shallow clone has no history to check ancestry and staleness against
needs_history = pytest.mark.skipif(headlines.shallow(), reason="a shallow clone")


def block(path: Path) -> str:
    begin, end = headlines.MARKERS
    return path.read_text().split(begin, 1)[1].split(end, 1)[0].strip("\n")


@pytest.fixture(scope="module")
def data():
    return json.loads(headlines.OUT.read_text())


# --------------------------------------------------------------------------- provenance


def test_every_record_names_its_commit_and_command_or_is_listed_with_why():
    names = headlines.record_names()
    missing = {n: p for n in names if n not in headlines.UNPROVENANCED
               and (p := headlines.provenance_problems(n, headlines.load(n)))}
    assert not missing, (
        "records without provenance (measure them again at a clean commit, delete them with "
        f"their citations, or list them in headlines.UNPROVENANCED with why): {missing}")
    proven = [n for n in headlines.UNPROVENANCED
              if n in names and not headlines.provenance_problems(n, headlines.load(n))]
    assert not proven, f"listed in UNPROVENANCED but provenanced (take them off): {proven}"
    gone = [n for n in headlines.UNPROVENANCED if n not in names]
    assert not gone, f"listed in UNPROVENANCED but not in benchmarks/results: {gone}"
    assert all(why.strip() for why in headlines.UNPROVENANCED.values())


def test_no_headline_record_is_unprovenanced_unless_listed_and_shown(data):
    """What the README quotes either has provenance or is flagged beside its number."""
    for entry in data["entries"]:
        for status in entry["records"]:
            if status["status"] == "unprovenanced":
                assert status["record"] in headlines.UNPROVENANCED
    assert "(unprovenanced, see the results page)" in block(headlines.README) or not any(
        s["status"] == "unprovenanced" for e in data["entries"] for s in e["records"])


@needs_history
def test_the_provenance_check_can_fail():
    head = headlines.head()
    good = {"machine": {"commit": head, "command": "x.py --a 1"}}
    assert headlines.provenance_problems("x.json", good) == []
    assert headlines.provenance_problems("x.json", {"provenance": {}}) == [
        "no machine entry (no commit, no command)"]
    dirty = {"machine": {"commit": head + "+dirty", "command": "x.py"}}
    assert "modified tree" in headlines.provenance_problems("x.json", dirty)[0]
    fake = {"machine": {"commit": "0123456789ab", "command": "x.py"}}
    assert "not a commit" in headlines.provenance_problems("x.json", fake)[0]
    assert headlines.provenance_problems("x.json", {"machine": {"commit": head}}) == [
        "machine.command: missing"]
    # a record built from training runs names the commit of each
    assert "trained_at: missing" in headlines.provenance_problems("convergence_x.json", good)[0]
    runs = dict(good, trained_at={"dense": head, "topk": head + "+dirty"})
    assert headlines.provenance_problems("convergence_x.json", runs) == [
        f"trained_at[topk]: {head}+dirty: measured on a modified tree"]


def test_records_of_the_headlines_name_their_commands_exactly():
    """A provenanced record of a headline run was made by that run's command, as written."""
    differ = {}
    for entry in headlines.HEADLINES:
        for run in entry.runs:
            for name in run.writes:
                path = headlines.RESULTS / name
                if not path.exists() or name in headlines.UNPROVENANCED:
                    continue
                recorded = headlines.load(name)["machine"]["command"]
                if recorded not in (run.command, headlines.EARLIER_COMMANDS.get(name)):
                    differ[name] = {"record": recorded, "headline": run.command}
    assert not differ, differ


# --------------------------------------------------------------------------- stale list


def test_every_record_has_measured_paths_that_exist():
    for name in headlines.record_names():
        paths = headlines.measured_paths(name)
        script = headlines.script_of(name)
        assert script is None or (ROOT / "benchmarks" / script).exists(), (name, script)
        assert any((ROOT / p).exists() for p in paths if not p.startswith(":")), name


def test_a_record_measures_what_its_script_imports_of_the_other_scripts():
    # outer_step.py trains through convergence.py and times through time_to_accuracy.py:
    # whole modules; sparcml_fig3.py takes three definitions of allreduce.py: only those
    outer = headlines.measured_paths("outer_step_lm_100mbit_p2.json")
    assert {"benchmarks/convergence.py", "benchmarks/time_to_accuracy.py",
            "benchmarks/step_time.py", "examples/train_lm.py"} <= set(outer)
    fig3 = headlines.measured_paths("sparcml_fig3_p8_1pct.json")
    assert "benchmarks/allreduce.py::TUNED_MALLOC_ENV,gather_volumes,random_sparse" in fig3
    assert "benchmarks/allreduce.py" not in fig3
    # the provenance tooling convergence.py imports measures nothing; of step_time.py it
    # takes density_name, which step_time.py takes from step_timing/modes.py: only that
    conv = headlines.measured_paths("convergence_lm.json")
    assert not any(p.startswith("benchmarks/headlines.py") for p in (*outer, *conv))
    assert [p for p in conv if p.startswith("benchmarks/step_tim")] == [
        "benchmarks/step_time.py::density_name", "benchmarks/step_timing/modes.py::density_name"]


def test_named_definitions_count_with_what_they_name_and_nothing_else():
    text = "A = 1\n\ndef f():\n    return g() + A\n\ndef g():\n    return 2\n\ndef h():\n    return 3\n"
    code = headlines.definitions_code(text, "x.py", "f")
    assert code == headlines.definitions_code(text.replace("return 3", "return 4"), "x.py", "f")
    assert code != headlines.definitions_code(text.replace("return 2", "return 5"), "x.py", "f")
    assert code != headlines.definitions_code(text.replace("A = 1", "A = 7"), "x.py", "f")
    assert code == headlines.definitions_code(text.replace("return 2", "return 2  # why"),
                                              "x.py", "f")
    assert headlines.definitions_code(None, "x.py", "f") is None


@needs_history
def test_a_change_outside_the_named_definitions_does_not_stale():
    # 1ed5c3b changed allreduce.py's worker, plot and sweep, not what sparcml_fig3.py takes
    before = "1ed5c3b^"
    assert headlines.changed_since(
        before, ["benchmarks/allreduce.py::TUNED_MALLOC_ENV,gather_volumes,random_sparse"]) == []
    assert headlines.changed_since(before, ["benchmarks/allreduce.py::sweep"]) == [
        "benchmarks/allreduce.py::sweep"]


def test_the_headlines_record_does_not_list_itself_as_stale():
    """headlines.json is rewritten by the run that writes its stale list: fresh by
    construction, so listing its previous version would say the opposite of what is true."""
    data = json.loads(headlines.OUT.read_text())
    assert headlines.OUT.name not in [s["record"] for s in data["stale"]]


def test_a_comment_or_docstring_is_not_a_change_of_code():
    code = headlines.code_text
    a = '"""Doc."""\ndef f(x):\n    """Doc."""\n    return x + 1  # one\n'
    b = '"""Other words."""\ndef f(x):\n    # why\n    return x + 1\n'
    c = '"""Doc."""\ndef f(x):\n    return x + 2\n'
    assert code(a, "m.py") == code(b, "m.py") and code(a, "m.py") != code(c, "m.py")
    cc = "int f() { return 1; } // one\n", "/* doc */\nint f() {\n return 1;\n}\n"
    assert code(cc[0], "k.h") == code(cc[1], "k.h") != code("int f() { return 2; }", "k.h")
    assert headlines.code_of("0" * 40, "gone.py") is None


@needs_history
def test_a_record_is_stale_when_its_measured_code_changed():
    """The stale list marks a record measured before a change of its code, not after."""
    log = headlines.git("log", "--format=%h", "-n", "400", "--", "benchmarks/selection.py")
    older = log.splitlines()[-1]  # selection.py's code has changed since then
    data = {"machine": {"commit": older, "command": "selection.py"}}
    entry = headlines.stale_entry("selection_cpu_x.json", data)
    assert entry is not None and "benchmarks/selection.py" in entry["changed"]
    fresh = {"machine": {"commit": headlines.head(), "command": "selection.py"}}
    assert headlines.stale_entry("selection_cpu_x.json", fresh) is None


# --------------------------------------------------------------------------- the pages


def test_the_readme_and_the_results_page_are_headlines_json_rendered(data):
    assert block(headlines.README) == headlines.readme_block(data), (
        "README.md's headline table differs from benchmarks/results/headlines.json: "
        "run `python -m benchmarks.headlines --write` at a clean commit")
    assert block(headlines.RESULTS_PAGE) == headlines.results_block(data)


def test_headlines_json_is_the_records_summarized(data):
    """Each entry's numbers, text and caveats as the records give them now."""
    assert not headlines.provenance_problems("headlines.json", data)
    entries = {e.name: e for e in headlines.HEADLINES}
    assert [e["name"] for e in data["entries"]] == list(entries)
    for got in data["entries"]:
        now = headlines.summarize(entries[got["name"]])
        for key in ("text", "statistic", "caveats"):
            assert got[key] == now[key], (got["name"], key)
        assert json.loads(json.dumps(now["numbers"])) == got["numbers"], got["name"]
        assert [(s["record"], s.get("commit")) for s in got["records"]] == \
            [(s["record"], s.get("commit")) for s in now["records"]]


def test_each_headline_states_its_statistic_with_a_count(data):
    for e in data["entries"]:
        if e["text"] != "not measured yet":
            assert any(ch.isdigit() for ch in e["statistic"]) or "count" in e["statistic"], e


# --------------------------------------------------------------------------- running


def test_quick_runs_two_entries_and_checks_their_commands(tmp_path):
    """The selection and SparCML entries end to end at a tiny size: each record names the
    command exactly as run (quick() fails otherwise), and the pages render from them."""
    proc = subprocess.run([sys.executable, "-m", "benchmarks.headlines", "--quick", "--only",
                           "selection", "sparcml_fig3"], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    tmp = Path(proc.stdout.strip().splitlines()[-1].split(" in ", 1)[1])
    readme = (tmp / "README.md").read_text()
    assert "`jss.topk` against `jax.lax.top_k` of the magnitudes" in readme
    assert "Sparse allreduce against `MPI_Allreduce`" in readme
    sel = json.loads((tmp / "selection_headline_cpu.json").read_text())
    assert sel["machine"]["command"].startswith("selection.py --sizes 64K")


def test_a_dirty_tree_is_refused(monkeypatch):
    monkeypatch.setattr(headlines, "dirty_paths", lambda: ["README.md"])
    with pytest.raises(SystemExit, match="the tree has changes"):
        headlines.main([])


def test_fresh_records_are_reused_and_stale_ones_run(monkeypatch):
    run = headlines.Run("x.py", ("a.json",), "", 1.0)
    monkeypatch.setattr(headlines, "record_status",
                        lambda n: {"record": n, "status": "fresh", "commit": "abc"})
    go, why = headlines.why_run(run, heavy=False, force=False)
    assert not go and why.startswith("reused: measured at abc")
    monkeypatch.setattr(headlines, "record_status", lambda n: {
        "record": n, "status": "stale", "commit": "abc", "changed": ["kernels/x.h"]})
    go, why = headlines.why_run(run, heavy=False, force=False)
    assert go and "kernels/x.h" in why
    heavy = headlines.Run("x.py", ("a.json",), "", 90.0, heavy=True)
    assert headlines.why_run(heavy, heavy=False, force=False) == (
        False, "heavy (~90 min of training): run with --heavy")


def test_accuracy_pairs_each_seed_with_dense_of_the_same_seed():
    rec = {"model": "cnn", "procs": 4, "lower_is_better": False, "metric": "test_accuracy",
           "seed_finals": {"dense": {"0": 98.0, "1": 99.0, "2": 97.0},
                           "topk_1pct_adamdir_mask_ramp": {"0": 98.5, "1": 98.0, "2": 97.5}}}
    s = headlines.accuracy_summary({"convergence_cnn_seeds.json": rec})
    n = s["numbers"]["cnn:topk_1pct_adamdir_mask_ramp"]
    # gaps +0.5, -1.0, +0.5: median +0.5 (unpaired medians would say 98.0 - 98.0 = 0)
    assert (n["gap"], n["gap_min"], n["gap_max"], n["seeds"]) == (0.5, -1.0, 0.5, 3)
    assert "gap +0.50 pt [-1.00, +0.50] over 3 seeds" in s["text"]
    one = {"model": "lm", "procs": 4, "lower_is_better": True, "metric": "val_loss", "seed": 0,
           "table": [{"mode": "dense", "final_val_loss": 2.0},
                     {"mode": "topk_1pct_adamdir_mask_ramp", "final_val_loss": 2.02}]}
    s = headlines.accuracy_summary({"convergence_lm_x.json": one})
    assert "lm: 1 seed only" in s["caveats"]


@needs_history
def test_a_training_run_is_reused_only_while_its_code_is_unchanged():
    import convergence

    head = headlines.head()
    assert convergence.reuse_problem({"trained_at_commit": head}) is None
    assert "modified tree" in convergence.reuse_problem({"trained_at_commit": head + "+dirty"})
    assert "no commit" in convergence.reuse_problem({})
    old = headlines.git("log", "--format=%h", "--", "jax_sparse_sync/transforms").split()[-1]
    assert "changed since" in convergence.reuse_problem({"trained_at_commit": old})
    # 1b897de changed only CUDA sources (kernels/*.cuh), which no CPU run executes
    cuda_only = headlines.git("diff", "--name-only", "1b897de^", "1b897de", "--", *headlines.HOST)
    assert cuda_only.split() == ["kernels/float_bits.cuh", "kernels/fused_accumulate.cuh"]
    assert not headlines.git("diff", "--name-only", "1b897de^", "1b897de", "--", *headlines.TRAIN)


@needs_history
def test_a_cpu_record_measures_the_cpu_modules_sources_and_no_cuda_source():
    """NOT_CUDA leaves out the CUDA sources at their paths before and after e92d8dd, and
    keeps ``cuda_missing.*``, which the CPU module compiles."""
    empty_tree = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"

    def tracked(commit):  # the files of ``commit`` that TRAIN's pathspecs select
        return set(headlines.git("diff", "--name-only", empty_tree, commit, "--",
                                 *headlines.TRAIN).split())
    for commit in ("e92d8dd^", "HEAD"):  # the flat ffi/ of then, and the tree of now
        files = tracked(commit)
        assert not [f for f in files if f.endswith((".cu", ".cuh")) or "_cuda." in f
                    or "cuda_handlers" in f or f.startswith("ffi/cuda/")], commit
        assert [f for f in files if "cuda_missing.cc" in f], commit


def test_a_sweep_records_the_drivers_command_not_its_workers(monkeypatch):
    import _harness

    monkeypatch.setattr(sys, "argv", ["/x/benchmarks/oktopk_volume.py", "--sweep", "--procs", "2"])
    worker = {"commit": "abc", "command": "oktopk_volume.py --size 1M --fragment /tmp/f.json"}
    got = _harness.driver_machine(worker)
    assert got["command"] == "oktopk_volume.py --sweep --procs 2"
    assert got["worker_command"] == worker["command"] and got["commit"] == "abc"
    assert _harness.sweep_fields([{"P": 2, "records": [1], "machine": worker}])["machine"] == got


def test_a_run_without_a_training_commit_is_stale_not_a_crash(monkeypatch):
    """A record outside TRAINED whose runs' commits are partly unknown: the stale list
    names the runs (the code they ran is unknown) instead of failing on the None."""
    monkeypatch.setattr(headlines, "changed_since", lambda commit, paths: [])
    monkeypatch.setattr(headlines, "provenance_problems", lambda name, data: [])
    data = {"machine": {"commit": "abc", "command": "x.py"},
            "trained_at": {"a_r0": "abc", "a_r1": None}}
    entry = headlines.stale_entry("somebench_p2.json", data)
    assert entry["changed"] == ["(run a_r1: no training commit)"]
    assert headlines.stale_entry("somebench_p2.json", dict(data, trained_at={"a": "abc"})) is None
