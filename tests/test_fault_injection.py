"""The fault injection of benchmarks/emulated_network.py, checked with UDP datagrams.

Two ranks' namespaces, no MPI: rank 0 sends numbered datagrams to rank 1 through
the emulated switch while a fault is on rank 0's link, and rank 1 reports what
arrived. Needs root and iproute2 (skipped with the reason otherwise); a few
seconds. (Every collective under every fault kind: benchmarks/faults.py.)
"""

import json
import os
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "benchmarks"))

import emulated_network as en  # noqa: E402

OK, WHY = en.usable()
pytestmark = pytest.mark.skipif(not OK, reason=f"emulated network not usable here: {WHY}")

PEER = r'''
import json, socket, sys, time
mode, addr, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
if mode == "recv":
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
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
    for i in range(count):
        s.sendto(str(i).encode(), (addr, 9999))
        time.sleep(0.001)
'''


def datagrams(net, count=400, idle_s=1.0):
    """Rank 0 sends ``count`` numbered datagrams to rank 1; what rank 1 received, in order."""
    recv = subprocess.Popen(["ip", "netns", "exec", net.ns(1), sys.executable, "-c", PEER,
                             "recv", net.address(1), str(count), str(idle_s)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert recv.stdout.readline().strip() == "ready"
        subprocess.run(["ip", "netns", "exec", net.ns(0), sys.executable, "-c", PEER, "send",
                        net.address(1), str(count)], check=True, timeout=30)
        out, _ = recv.communicate(timeout=30)
    finally:
        recv.kill()
    return json.loads(out.splitlines()[-1])


@pytest.fixture(scope="module")
def net():
    with en.EmulatedNetwork(2, rate_mbit=100) as network:
        yield network
    assert not [ns for ns in en.list_namespaces() if ns.startswith(network.prefix + "_")]


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

    net.set_reordering(0, 0.3, lane_mbit=0.05)  # ~10 ms per datagram in the slow lane
    got = datagrams(net, idle_s=2.0)
    delayed = net.fault_counts(0)["delayed"]
    net.set_reordering(0, None)
    assert sorted(got) == list(range(400)), len(got)
    assert sum(b < a for a, b in zip(got, got[1:])) > 10  # overtaken
    assert delayed > 50
    assert datagrams(net) == list(range(400))  # cleared


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


def test_inject_rejects_an_unknown_kind_and_bad_probability(net):
    with pytest.raises(ValueError, match="kind must be one of"):
        net.inject("meteor", 0, 1.0)
    with pytest.raises(ValueError, match="probability"):
        net.set_loss(0, 1.5)
    with pytest.raises(ValueError, match="rank 5"):
        net.link_down(5)
