"""benchmarks/grouping.py's prediction of a plan's step: one rule for the worker and for
the recorded runs (``predict_plans``, ``repredict``), and the stale-profile scale."""

import dataclasses
import json
import os
import sys
from pathlib import Path

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "benchmarks"))

import grouping as G  # noqa: E402

RECORDED = sorted((Path(HERE).parent / "benchmarks" / "results").glob("grouping_*_p2.json"))


def test_a_profile_slower_than_the_whole_step_is_scaled_to_it():
    assert G.stale_profile_scale(6.0, 4.2) == pytest.approx(0.7)
    assert G.stale_profile_scale(4.0, 5.0) == 1.0  # the gradient inside the step: kept
    assert G.stale_profile_scale(5.0, 5.0) == 1.0
    assert G.stale_profile_scale(0.0, 5.0) == 1.0  # no profile time: nothing to scale


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.stem)
def test_the_recorded_runs_are_predicted_by_the_current_rule(path):
    """With the run's own profile and calibration, the shared rule gives back what the
    run itself predicted (the worker and ``repredict`` are one rule); the file's
    predictions are the current rules' (its link's burst, gamma fitted again from its
    contention timings, a stale profile scaled)."""
    data = json.loads(path.read_text())
    for run in data["runs"]:
        # the run's own rule: its profile as measured, its calibration as recorded
        unscaled = G.repredict(run, G.run_params(run, current=False), scale=1.0)
        current = G.repredict(run)
        for r in run["records"]:
            if r["plan"] == "no_sync":
                continue
            # what the run predicted from the profile as measured: kept as
            # predicted_at_run_s by a later repredict, as predicted_unscaled_s by a run
            # that scaled a stale profile itself
            at_run = r.get("predicted_at_run_s", r.get("predicted_unscaled_s", r["predicted_s"]))
            assert unscaled[r["plan"]] == pytest.approx(at_run, rel=1e-9), r["plan"]
            assert current[r["plan"]] == pytest.approx(r["predicted_s"], rel=1e-9), r["plan"]
            assert r["error"] == pytest.approx(
                (r["predicted_s"] - r["measured_s"]) / r["measured_s"], rel=1e-9)
        assert data["goals"][data["runs"].index(run)] == G.goals(run)


def test_the_scale_is_the_profile_measured_on_a_faster_clock():
    """Predicting with ``scale`` equals predicting from the profile whose times are
    ``scale`` times as long; a stale profile (slower than the no-sync step) is scaled by
    default, and the scaled ungrouped step is the step without a sync plus the sync."""
    run = json.loads(next(p for p in RECORDED if "lm_topk_1gbit" in p.name).read_text())["runs"][0]
    from jax_sparse_sync.planning.profile import BackwardProfile

    measured = BackwardProfile.from_json(run["profile"])
    # stale as this run's profile was at bf0ddc9 (scaled by 0.702 then): the machine
    # profiled on a slower clock than it timed on
    stretch = 1 / 0.702
    prof = dataclasses.replace(measured, ready_s=tuple(r * stretch for r in measured.ready_s),
                               compute_s=measured.compute_s * stretch)
    none_s = next(r["measured_s"] for r in run["records"] if r["plan"] == "no_sync")
    assert prof.compute_s > 1.3 * none_s
    groups_of = {"ungrouped": None, "wfbp": [((i,), "normal") for i in prof.order]}
    kw = dict(nranks=run["P"], size=run["N"], density=run["density"], sync="topk",
              algorithm="auto", params=G.run_params(run), none_s=none_s)
    scale = G.stale_profile_scale(prof.compute_s, none_s)
    by_default = G.predict_plans(prof, groups_of, **kw)
    faster = dataclasses.replace(prof, ready_s=tuple(r * scale for r in prof.ready_s),
                                 compute_s=prof.compute_s * scale)
    explicit = G.predict_plans(faster, groups_of, **kw, scale=1.0)
    assert by_default == pytest.approx(explicit, rel=1e-12)
    unscaled = G.predict_plans(prof, groups_of, **kw, scale=1.0)
    for name in groups_of:  # the stale profile's time comes off every prediction
        assert unscaled[name] - by_default[name] == pytest.approx(
            prof.compute_s - none_s, rel=0.05)
    # the scaled ungrouped step: the no-sync step plus a sync of tens of ms, not seconds
    assert none_s < by_default["ungrouped"] < none_s + 0.2
