"""Smoke test of benchmarks/emulated_network.py: 2 ranks in network namespaces, TCP over veths.

Needs root and iproute2 (``ip netns``, ``tc``); skipped with the reason otherwise.
Runs a tiny ``sparse_allreduce`` of every algorithm through a 200 Mbit/s
emulated network, checks it against NumPy, checks that the bytes went over
the veths and that the link is rate-limited, and that nothing is left behind.
"""

import json
import os
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import emulated_network as en  # noqa: E402

OK, WHY = en.usable()
pytestmark = pytest.mark.skipif(not OK, reason=f"emulated network not usable here: {WHY}")

RANK_SCRIPT = r'''
import json, sys
import numpy as np
import jax
import jax_sparse_sync as jss

comm = jss.mpi.default_comm()
rank, p = comm.Get_rank(), comm.Get_size()
n, k = 1 << 16, 512
rng = np.random.default_rng([7, rank])
idx = np.sort(rng.choice(n, size=k, replace=False)).astype(np.int32)
vals = rng.standard_normal(k).astype(np.float32)
ref = np.zeros(n)
for ri, rv in comm.allgather((idx, vals)):
    np.add.at(ref, ri, rv.astype(np.float64))
sent = {}
for algo in ("dense", "allgather", "recursive_doubling", "split_allgather", "dsar_split_allgather"):
    out, st = jax.jit(lambda v, i: jss.sparse_allreduce(v, i, size=n, algorithm=algo,
                                                        return_stats=True))(vals, idx)
    assert np.allclose(np.asarray(out), ref, rtol=1e-5, atol=1e-5), algo
    sent[algo] = int(st.bytes_sent)
with open(f"{sys.argv[1]}/rank{rank}.json", "w") as f:  # not stdout: ranks' lines interleave
    json.dump({"rank": rank, "size": p, "bytes_sent": sent}, f)
'''


def _ours(prefix):
    return [ns for ns in en.list_namespaces() if ns.startswith(prefix + "_")]


def test_sparse_allreduce_over_emulated_network(tmp_path):
    t0 = time.monotonic()
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    net = en.EmulatedNetwork(2, rate_mbit=200, delay_ms=0.0)
    with net:
        assert len(_ours(net.prefix)) == 3  # 2 ranks + the switch
        before = net.counters()
        proc = net.launch([str(script), str(tmp_path)], timeout=45, cwd=ROOT)
        after = net.counters()
        assert proc.returncode == 0, proc.stdout[-4000:]
        results = [json.loads(f.read_text()) for f in sorted(tmp_path.glob("rank*.json"))]
        assert sorted(r["rank"] for r in results) == [0, 1], proc.stdout[-4000:]
        assert all(r["size"] == 2 for r in results)
        for r in results:
            ns = net.ns(r["rank"])
            tx = after[ns]["tx_bytes"] - before[ns]["tx_bytes"]
            payload = sum(r["bytes_sent"].values())
            # the payload (plus TCP/IP headers and MPI's own messages) went over the veth
            assert payload > 256 << 10 and tx >= payload, (ns, tx, payload)
        # rate-limited: 4 MiB each way must take about 4 MiB * 8 / 200 Mbit/s = 168 ms
        rate = net.measure_rate(4 << 20, repeats=2, timeout=30, allreduce=False)
        assert rate["sendrecv"]["went_over_veth"]
        assert 0.5 * 200 < rate["achieved_mbit"] <= 1.05 * 200, rate
        assert rate["one_way_latency_s"] < 0.05
    assert not _ours(net.prefix), "namespaces left behind"
    assert time.monotonic() - t0 < 60


def test_teardown_on_exception():
    net = en.EmulatedNetwork(2, rate_mbit=100)
    with pytest.raises(RuntimeError, match="boom"):
        with net:
            assert len(_ours(net.prefix)) == 3
            raise RuntimeError("boom")
    assert not _ours(net.prefix)
    net.down()  # idempotent


def test_launch_timeout_kills_job(tmp_path):
    script = tmp_path / "hang.py"
    script.write_text("import time\ntime.sleep(60)\n")
    with en.EmulatedNetwork(2, rate_mbit=100) as net:
        t0 = time.monotonic()
        with pytest.raises(en.NetworkError, match="timed out"):
            net.launch([str(script)], timeout=3)
        assert time.monotonic() - t0 < 20
        for i in range(2):  # nothing of ours still runs inside the namespaces
            assert not en._run(["ip", "netns", "pids", net.ns(i)], check=False).stdout.split()
    assert not _ours(net.prefix)
