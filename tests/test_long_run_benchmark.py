"""benchmarks/long_run.py runs end to end (a short run at 2 ranks) and records what it claims."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_long_run_smoke(tmp_path):
    out = tmp_path / "long_run.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "long_run.py"), "--procs", "2", "--steps", "60",
         "--every", "10", "--check-every", "30", "--warmup", "20", "--out", str(out),
         "--timeout", "400"], cwd=ROOT, capture_output=True, text=True, timeout=500)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    record = json.loads(out.read_text())
    assert out.with_suffix(".png").exists()
    assert record["trace_steps"] == [1, 10, 20, 30, 40, 50, 60]
    assert record["replica_checks"] == 2 and record["replica_mismatches"] == 0
    assert record["machine"]["command"].startswith("long_run.py --procs 2")
    assert record["machine"]["commit"]
    ranks = record["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    for r in ranks:
        assert len(r["rss_bytes"]) == 7 and min(r["rss_bytes"]) > 0
        # 60 steps moved bytes; the totals are Python ints summed from per-step counters
        assert r["bytes_sent"] > 0 and r["bytes_received"] > 0 and r["saturated_steps"] == 0
        assert r["rss_at_warmup_end"] == r["rss_bytes"][2]
    assert record["max_growth_after_warmup_pct"] == max(r["growth_after_warmup_pct"]
                                                        for r in ranks)
