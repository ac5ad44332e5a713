"""The fault injection of benchmarks/emulated_network.py, checked with UDP datagrams.

Two ranks' namespaces, no MPI: rank 0 sends numbered datagrams to rank 1 through
the emulated switch while a fault is on rank 0's link, and rank 1 reports what
arrived. And one MPI job whose link dies for good must be ended by the watchdog
within its timeout + 5 s. Needs root and iproute2 (skipped with the reason
otherwise); about 30 s in all. (Every collective under every fault kind:
benchmarks/faults.py.)
"""

import json
import os
import re
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "benchmarks"))

import emulated_network as en  # noqa: E402

import faults  # noqa: E402

OK, WHY = en.usable()
needs_network = pytest.mark.skipif(not OK, reason=f"emulated network not usable here: {WHY}")

PEER = r'''
import json, socket, sys, time
mode, addr, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
if mode == "recv":
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, 33, 8 << 20)  # SO_RCVBUFFORCE (root): keep a burst
    s.bind((addr, 9999))
    s.settimeout(float(sys.argv[4]))
    print("ready", flush=True)
    seq = []
    try:
        while True:
            seq.append(int(s.recv(100)))
    except socket.timeout:
        pass
    print(json.dumps(seq), flush=True)
else:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    gap = float(sys.argv[4])
    for i in range(count):
        s.sendto(str(i).encode(), (addr, 9999))
        if gap:
            time.sleep(gap)
'''


def datagrams(net, count=400, idle_s=1.0, gap_s=0.001):
    """Rank 0 sends ``count`` numbered datagrams to rank 1, ``gap_s`` apart; what rank 1
    received, in order."""
    recv = subprocess.Popen(["ip", "netns", "exec", net.ns(1), sys.executable, "-c", PEER,
                             "recv", net.address(1), str(count), str(idle_s)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert recv.stdout.readline().strip() == "ready"
        subprocess.run(["ip", "netns", "exec", net.ns(0), sys.executable, "-c", PEER, "send",
                        net.address(1), str(count), str(gap_s)], check=True, timeout=30)
        out, _ = recv.communicate(timeout=30)
    finally:
        recv.kill()
    return json.loads(out.splitlines()[-1])


@pytest.fixture(scope="module")
def net():
    with en.EmulatedNetwork(2, rate_mbit=100) as network:
        yield network
    assert not [ns for ns in en.list_namespaces() if ns.startswith(network.prefix + "_")]


@needs_network
def test_loss_duplication_and_reordering_change_what_arrives(net):
    assert datagrams(net) == list(range(400))  # fault-free: all, once, in order

    net.set_loss(0, 0.5)
    got = datagrams(net)
    dropped = net.fault_counts(0)["dropped"]
    net.set_loss(0, None)
    assert 100 < len(got) < 300 and got == sorted(set(got)), len(got)
    assert dropped >= 400 - len(got)  # the kernel counted the drops (the ARP ones too)

    net.set_duplication(0, 0.25)
    got = datagrams(net)
    copies = net.fault_counts(0)["duplicated"]
    net.set_duplication(0, None)
    assert set(got) == set(range(400)) and 430 < len(got) < 700, len(got)
    assert copies >= len(got) - 400

    # ~10 ms per datagram in the slow lane; all sent at once, so that the lane queues
    # whatever the machine's load
    net.set_reordering(0, 0.3, lane_mbit=0.05)
    got = datagrams(net, idle_s=2.0, gap_s=0)
    delayed = net.fault_counts(0)["delayed"]
    net.set_reordering(0, None)
    assert sorted(got) == list(range(400)), len(got)
    overtaken = sum(x < max(got[:i]) for i, x in enumerate(got) if i)  # arrived after a later one
    assert overtaken > 30, got
    assert delayed > 50
    assert datagrams(net) == list(range(400))  # cleared


@needs_network
def test_link_down_up_rate_and_pause(net):
    tc = ["tc", "-n", net.switch, "qdisc", "show", "dev", "port0"]
    net.set_link_rate(0, 7)
    assert "rate 7Mbit" in subprocess.run(tc, capture_output=True, text=True).stdout
    net.set_link_rate(0, None)
    assert "rate 100Mbit" in subprocess.run(tc, capture_output=True, text=True).stdout

    net.link_down(0)
    assert datagrams(net, count=50, idle_s=0.5) == []
    net.link_up(0)
    for _ in range(50):  # carrier back
        if datagrams(net, count=20, idle_s=0.3) == list(range(20)):
            break
        time.sleep(0.1)
    else:
        pytest.fail("the link did not come back")

    sleeper = subprocess.Popen(["ip", "netns", "exec", net.ns(1), sys.executable, "-c",
                                "import time; time.sleep(30)"])
    try:
        for _ in range(50):
            if net.rank_pids(1):
                break
            time.sleep(0.05)
        pids = net.pause_rank(1)
        assert pids == [sleeper.pid]  # `ip netns exec` execs the program
        time.sleep(0.1)
        assert open(f"/proc/{sleeper.pid}/stat").read().split(") ")[1][0] == "T"
        net.resume_rank(1)
        time.sleep(0.1)
        assert open(f"/proc/{sleeper.pid}/stat").read().split(") ")[1][0] == "S"
    finally:
        sleeper.kill()
        sleeper.wait()


@needs_network
def test_inject_rejects_an_unknown_kind_and_bad_probability(net):
    with pytest.raises(ValueError, match="kind must be one of"):
        net.inject("meteor", 0, 1.0)
    with pytest.raises(ValueError, match="probability"):
        net.set_loss(0, 1.5)
    with pytest.raises(ValueError, match="rank 5"):
        net.link_down(5)


def _job(name, kind, digest_of, steps=6, t_on=None, t_off=None, op_s=0.01):
    """A synthetic job of benchmarks/faults.py: 2 ranks, step s from t = s to s + op_s * ops."""
    ranks = {}
    for r in range(2):
        ranks[r] = {"steps": steps, "digests": {op: [digest_of(r, op, s) for s in range(steps)]
                                                for op in faults.OPERATIONS},
                    "op_s": {op: [op_s] * steps for op in faults.OPERATIONS},
                    "step_t0": [float(s) for s in range(steps)],
                    "step_t1": [s + op_s * len(faults.OPERATIONS) for s in range(steps)],
                    "compute_s": [0.001] * steps, "straggling_steps": 0}
    return {"name": name, "kind": kind, "duration_s": 1.0, "params": {}, "rc": 0,
            "hang": False, "fault": {"t_applied": t_on, "t_end": t_off}, "t_exit": 0.0, "watchdog_s": 20.0,
            "output_tail": "", "ranks": ranks}


def test_the_benchmark_counts_a_wrong_digest_and_replicas_that_differ():
    class Args:
        fault_rank, watchdog_timeout = 1, 20.0

    good = lambda r, op, s: f"{op}{s}"  # noqa: E731
    ref = _job("none", "none", good)
    fine = _job("loss_2pct", "loss", good, t_on=2.0, t_off=3.5, op_s=0.03)
    bad = _job("jitter", "jitter", lambda r, op, s: "x" if (r, op, s) == (1, "topk_sync", 4)
               else good(r, op, s), t_on=2.0, t_off=3.5)
    result = faults.analyse([fine, bad], ref, Args)
    assert result["faults"]["loss_2pct"]["wrong"] == 0
    assert result["faults"]["loss_2pct"]["replicas_differ"] == 0
    assert result["faults"]["loss_2pct"]["compared"] == 2 * 6 * len(faults.OPERATIONS)
    assert result["faults"]["loss_2pct"]["slowdown"]["topk_sync"] == pytest.approx(3.0)
    assert result["faults"]["loss_2pct"]["steps_in_fault_window"] == 2  # steps 2 and 3
    assert result["faults"]["jitter"]["wrong"] == 1
    assert result["faults"]["jitter"]["replicas_differ"] == 1
    summary = faults.summary(result)
    assert summary["wrong_results"] == 1 and summary["hangs"] == 0


def test_the_benchmark_plots_a_record(tmp_path):
    class Args:
        fault_rank, watchdog_timeout = 1, 20.0

    good = lambda r, op, s: f"{op}{s}"  # noqa: E731
    jobs = [_job("loss_2pct", "loss", good, t_on=2.0, t_off=3.5, op_s=0.03)]
    data = {"config": {"procs": 2, "rate_mbit": 1000.0, "fault_rank": 1},
            **faults.analyse(jobs, _job("none", "none", good), Args)}
    data["summary"] = faults.summary(data)
    faults.plot(data, tmp_path / "reliability.png")
    assert (tmp_path / "reliability.png").stat().st_size > 10_000


DEAD_LINK_RANK = r'''
import os, sys, time
import jax, jax.numpy as jnp
import jax_sparse_sync as jss

ctl = sys.argv[1]
rank = jss.mpi.default_comm().Get_rank()
values = jnp.arange(1, 257, dtype=jnp.float32) * (rank + 1)
indices = jnp.arange(256, dtype=jnp.int32) * (rank + 1)
# recursive doubling: point-to-point messages, whose peer the report names
op = lambda: jss.sparse_allreduce(values, indices, size=4096, algorithm="recursive_doubling")
jax.block_until_ready(op())  # compiled
jss.mpi.set_timeout(float(sys.argv[2]))
open(os.path.join(ctl, f"ready{rank}"), "w").close()
while True:  # until the link dies and the watchdog ends the job
    jax.block_until_ready(op())
'''


@needs_network
def test_a_link_that_stays_down_ends_the_job_through_the_watchdog(tmp_path):
    """Rank 1's link down for good while 2 ranks loop over sparse_allreduce: the job
    must end within the watchdog's timeout + 5 s, with its message naming the op and the
    peer the reporting rank waits for (the other rank, across the dead link)."""
    import threading

    timeout_s = 3.0
    script = tmp_path / "rank.py"
    script.write_text(DEAD_LINK_RANK)
    os.chmod(tmp_path, 0o777)
    down_at = {}
    with en.EmulatedNetwork(2, rate_mbit=1000) as net:
        def kill_link():
            deadline = time.monotonic() + 80
            while not all((tmp_path / f"ready{r}").exists() for r in range(2)):
                if time.monotonic() > deadline:
                    return
                time.sleep(0.05)
            time.sleep(0.3)
            net.link_down(1)
            down_at["t"] = time.monotonic()

        thread = threading.Thread(target=kill_link, daemon=True)
        thread.start()
        proc = net.launch(["-m", "mpi4py", str(script), str(tmp_path), str(timeout_s)],
                          timeout=60, cwd=os.path.dirname(HERE))
        ended = time.monotonic()
        thread.join(timeout=5)
    assert "t" in down_at, proc.stdout[-3000:]  # the ranks got ready and the link went down
    assert proc.returncode != 0, proc.stdout[-3000:]
    assert ended - down_at["t"] <= timeout_s + 5, (ended - down_at["t"], proc.stdout[-3000:])
    report = re.search(r"jax_sparse_sync watchdog: rank (\d) \(pid \d+\): `sparse_allreduce` #\d+ "
                       r"on the communicator of world ranks 0, 1 has not completed", proc.stdout)
    assert report, proc.stdout[-3000:]
    me = int(report.group(1))
    peer = 1 - me
    assert "every rank entered" in proc.stdout, proc.stdout[-3000:]
    # where it waits: a message of a recursive doubling round from the peer, or the
    # peer's header in the argument check (Bruck's allgather, point to point), whichever
    # the link died in
    assert re.search(rf"\n  rank {me} waits for a message from rank {peer} (\(recursive_doubling "
                     rf"round 1, MPI_Sendrecv|\(56 B\) \(recursive_doubling, MPI_Waitall "
                     rf"\(argument check\)\))", proc.stdout), \
        proc.stdout[-3000:]
    assert "MPI_Abort" in proc.stdout
