"""The device campaign's dry run: scripts/gpu_campaign.sh on the CPU at tiny sizes.

A GPU machine is lent only now and then, for minutes; the campaign must work the
first time it runs there. Its dry run takes every step that needs no GPU (the
selection benchmark, the sparse step of the MLP and of a tiny LM, at P = 1 also through
the mesh transport, grouping and step time with ranks bound to cores) through the same
script and command lines at tiny sizes, and checks what each step leaves in the results
archive, so the campaign cannot rot in between.
"""

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from shared_directory import shared_directory
from test_multirank import with_fast_emitters

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    def produce(out):
        # its checks compare within each step's job (replicas, the selection's reference)
        env = with_fast_emitters(dict(os.environ, OUT=str(out), JSS_CAMPAIGN_DRY_RUN="1",
                                      PYTHON=sys.executable, CAMPAIGN_S="560"))
        proc = subprocess.run(["bash", "scripts/gpu_campaign.sh"], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=620)
        log = (out / "campaign.log").read_text() if (out / "campaign.log").exists() else ""
        assert proc.returncode == 0, (proc.stdout + proc.stderr + log)[-4000:]
        with tarfile.open(out / "campaign_results.tgz") as tar:
            tar.extractall(out / "results", filter="data")

    # run once even where parallel workers share this module's tests
    out = shared_directory(tmp_path_factory, "campaign_out", produce)
    log = out / "campaign.log"
    return out / "results", log.read_text() if log.exists() else ""


def test_every_step_ran_and_succeeded(dry_run):
    results, log = dry_run
    steps = dict(line.split(" ", 1) for line in (results / "steps.txt").read_text().splitlines())
    assert set(steps) == {"selection", "gpu_step_p1", "gpu_step_p2", "host_group",
                          "host_step_p2"}, steps
    for name, status in steps.items():
        assert status.startswith("rc=0 "), (name, status, log[-3000:])
    assert "device=dryrun" in (results / "campaign.txt").read_text()


def test_selection_results_were_checked_and_timed(dry_run):
    results, _ = dry_run
    data = json.loads((results / "selection_dryrun.json").read_text())
    assert data["machine"]["commit"], "the record names its commit"
    methods = {r["method"] for r in data["records"]}
    assert {"topk", "lax.top_k", "threshold_select"} <= methods, methods
    assert all(r["median_s"] > 0 for r in data["records"] if r["method"] in methods)


def test_sparse_step_records_identical_replicas_and_ratios(dry_run):
    results, _ = dry_run
    for p in (2,):  # the dry run's P (scripts/gpu_campaign.sh)
        data = json.loads((results / f"gpu_step_dryrun_p{p}.json").read_text())
        assert not data["errors"], data["errors"]
        recs = {r["mode"]: r for r in data["records"] if r["model"] == "mlp"}
        assert set(recs) == {"none", "topk_1pct", "oktopk_1pct"}
        for mode in ("topk_1pct", "oktopk_1pct"):
            r = recs[mode]
            assert r["P"] == p and r["replicas_identical"] is True
            assert r["ratio_to_none"] == pytest.approx(r["step_s"] / recs["none"]["step_s"])
            assert r["update_s"] > 0 and r["topk_s"] > 0 and r["allreduce_s"] > 0
            assert r["stats"]["bytes_sent"] >= 0
        assert (results / f"gpu_step_dryrun_p{p}.png").stat().st_size > 0


def test_lm_step_records_its_baseline_and_breakdown(dry_run):
    # the examples' LM (tiny here, in the P = 2 job; 101.6M parameters on the device):
    # adam_direction_sync(topk_sync) against AdamW (its baseline, added by the
    # benchmark), with the breakdown (grad, select, exchange, update)
    results, _ = dry_run
    data = json.loads((results / "gpu_step_dryrun_p2.json").read_text())
    recs = {r["mode"]: r for r in data["records"] if r["model"] == "lm"}
    assert set(recs) == {"adamw", "adam_topk_1pct"} and data["lm"]["dim"] == 32
    r = recs["adam_topk_1pct"]
    assert r["P"] == 2 and r["baseline"] == "adamw" and r["replicas_identical"] is True
    assert r["ratio_to_baseline"] == pytest.approx(r["step_s"] / recs["adamw"]["step_s"])
    assert min(r["grad_s"], r["topk_s"], r["allreduce_s"], r["update_s"]) > 0
    assert r["k"] == max(1, round(0.01 * r["N"]))


def test_axis_transport_steps_match_the_mpi_steps(dry_run):
    # P = 1: each sync mode also through jss.axis in shard_map over a one-device mesh
    # (on the GPU: the fully on-device step), its updates checked bit for bit against
    # the MPI transport's, timed and broken down the same way, beside its MPI record
    results, _ = dry_run
    data = json.loads((results / "gpu_step_dryrun_p1.json").read_text())
    assert not data["errors"], data["errors"]
    assert data["transports"] == ["mpi", "axis"]
    recs = {(r["model"], r["mode"], r["transport"]): r for r in data["records"]}
    # the dry run twins the MLP's topk_sync (scripts/gpu_campaign.sh: each mode is two
    # more programs to compile); the GPU campaign twins every mode of both models
    synced = {("mlp", "topk_1pct")}
    assert {(m, mode) for m, mode, t in recs if t == "axis"} == synced, sorted(recs)
    for model, mode in synced:
        mpi, axis = recs[model, mode, "mpi"], recs[model, mode, "axis"]
        assert axis["P"] == 1 and axis["k"] == mpi["k"] and axis["N"] == mpi["N"]
        assert axis["updates_identical_to_mpi"] is True
        assert isinstance(axis["params_identical_to_mpi"], bool)
        assert min(axis["topk_s"], axis["allreduce_s"], axis["update_s"], axis["step_s"]) > 0
        base = recs[model, "adamw" if model == "lm" else "none", "mpi"]
        assert axis["ratio_to_baseline"] == pytest.approx(axis["step_s"] / base["step_s"])
        assert axis["stats"]["bytes_sent"] >= 0


def test_host_steps_bind_each_rank_and_predict(dry_run):
    results, _ = dry_run
    step = json.loads((results / "step_time_campaign_dryrun_p2.json").read_text())
    assert step["bind_to"] == "core:1"
    modes = {r["mode"] for r in step["records"]}
    assert {"none", "dense", "topk_1pct_auto"} <= modes, modes
    group = json.loads((results / "grouping_campaign_dryrun.json").read_text())
    assert group["bind_to"] == "core:1" and not group["failures"], group["failures"]
    plans = {r["plan"]: r for r in group["runs"][0]["records"]}
    assert {"no_sync", "none", "wfbp"} <= set(plans), set(plans)
    for name in ("none", "wfbp"):  # the plans have predictions; the reference does not
        assert plans[name]["measured_s"] > 0 and plans[name]["predicted_s"] > 0, plans[name]
