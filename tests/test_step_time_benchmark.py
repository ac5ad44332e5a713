"""benchmarks/step_time.py's bookkeeping (the timing itself runs under mpiexec, not here)."""

import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _step_time_module():
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    path = os.path.join(ROOT, "benchmarks", "step_time.py")
    spec = importlib.util.spec_from_file_location("_step_time", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_repeats_keep_the_median_job_whole():
    median_records = _step_time_module().median_records

    def run(mode, step_s, local, repeat, p=4):
        return {"model": "cnn", "link": "1000", "P": p, "mode": mode, "step_s": step_s,
                "local_step_s": local, "repeat": repeat}
    runs = [run("topk", 0.30, 0.20, 0), run("none", 0.10, None, 0),
            run("topk", 0.12, 0.11, 1), run("none", 0.11, None, 1),
            run("topk", 0.15, 0.13, 2), run("none", 0.50, None, 2), run("topk", 0.9, 0.1, 0, p=8)]
    recs = {(r["mode"], r["P"]): r for r in median_records(runs)}
    assert len(recs) == 3
    topk = recs[("topk", 4)]
    # the median repeat's record, its local time from the same job (not a mix)
    assert (topk["step_s"], topk["local_step_s"], topk["repeat"]) == (0.15, 0.13, 2)
    assert topk["repeats_step_s"] == [0.30, 0.12, 0.15]
    assert recs[("none", 4)]["step_s"] == 0.11 and recs[("topk", 8)]["repeats_step_s"] == [0.9]
    assert "repeats_step_s" not in runs[0]  # the raw runs are left as they were
