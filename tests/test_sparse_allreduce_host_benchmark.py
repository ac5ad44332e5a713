"""benchmarks/sparse_allreduce_host.py end to end at a tiny size (one job: P = 2, the
allocator opted out of the library's tuning), written to a temporary directory."""

import sys

from test_benchmark_smoke import run, script, written


def test_sparse_allreduce_host_smoke(tmp_path):
    out = tmp_path / "sparse_allreduce_host.json"
    run([sys.executable, script("sparse_allreduce_host.py"), "--sweep", "--procs", "2",
         "--allocators", "untuned", "--rounds", "1", "--repeats", "2", "--warmup", "1",
         "--size", "64K", "--ks", "100", "--dense-size", "64K", "--lock", "", "--timeout", "240",
         "--out", str(out)], timeout=300)
    data = written(out)
    assert not data["failures"], data["failures"]
    # the record names the sweep's command (what reproduces it), the job's beside it
    assert data["machine"]["command"].startswith("sparse_allreduce_host.py --sweep")
    assert "--allocator untuned" in data["machine"]["worker_command"]
    # the ranks were launched opted out, and the library's import saw it
    (job,) = data["runs"]
    assert job["default_tuning"] == {} and job["env"]["JSS_TUNE_HOST_ALLOCATOR"] == "0"
    rows = {(r["case"], r["method"]): r for r in data["summary"]}
    assert set(rows) == {(c, m) for c in ("sparse k=100", "dense_sync") for m in ("ours", "plain")}
    assert all(r["vs_plain"] > 0 and r["P"] == 2 and r["allocator"] == "untuned"
               for r in rows.values())
    assert rows[("sparse k=100", "plain")]["vs_plain"] == 1.0
