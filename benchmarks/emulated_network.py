"""An emulated cluster network on one Linux host: network namespaces, veths, a bridge, tc.

Needs root (``ip netns``, ``tc``). Layout for P ranks, with a per-run unique
``prefix`` (default ``jss<pid>x<random hex>``; ``cleanup_stale()`` reads the pid)::

    namespace <prefix>_sw : bridge "br0" + one port "port<i>" per rank   (the switch)
    namespace <prefix>_<i>: "lo" + "jssv0" = 10.77.<subnet>.<i+1>/24    (rank i's host)

Each veth is shaped in both directions by a ``tc tbf`` qdisc (``rate_mbit``): full
duplex links through a non-blocking switch; ``delay_ms`` > 0 adds a ``netem`` delay.
Nothing touches the root namespace's networking. MPICH ranks run MPMD style, one per
namespace (``mpiexec -n 1 ip netns exec <prefix>_0 python script.py ARGS : ...``), with
``MPIR_CVAR_NOLOCAL=1``, ``MPIR_CVAR_CH4_NETMOD=ofi``, ``FI_PROVIDER=tcp`` and
``FI_TCP_IFACE=jssv0``. Teardown (``down()``; also on ``__exit__``, at interpreter exit
and on SIGTERM/SIGHUP) kills what is left in our namespaces and deletes them; every
external command has a timeout.

Faults (``FAULT_KINDS``, ``EmulatedNetwork.inject``) on one rank's link, from ``tbf``,
``clsact``, classic-BPF filters, ``mirred`` and ``ifb`` (no ``netem`` needed): link down,
rate changes and jitter, loss, duplication, reordering, a paused rank;
``fault_counts(i)`` reads what the kernel counted, ``supported_faults()`` probes this
kernel (docs/topics/reliability.md).

Command line::

    python benchmarks/emulated_network.py --check            # usable()? 2 ranks at 200 Mbit/s, probe
    python benchmarks/emulated_network.py --rate 500 --nranks 8 --measure
    python benchmarks/emulated_network.py --cleanup          # deletes stale jss* namespaces of dead runs
    python benchmarks/emulated_network.py --faults           # which fault kinds this kernel supports
    python benchmarks/emulated_network.py --measure --fault loss=0.02   # the rate under 2 % loss on link 0
"""

from __future__ import annotations

import atexit
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from _harness import find_mpiexec, kill_group  # noqa: E402

IFACE = "jssv0"         # the rank-side interface, the same name in every rank namespace
BRIDGE = "br0"
CMD_TIMEOUT = 20.0      # seconds for each ip / tc call
MPI_ENV = {
    "MPIR_CVAR_NOLOCAL": "1",            # no shared memory between "local" ranks
    "MPIR_CVAR_CH4_NETMOD": "ofi",
    "FI_PROVIDER": "tcp",
    "FI_TCP_IFACE": IFACE,
    "JAX_PLATFORMS": "cpu",
    "PYTHONUNBUFFERED": "1",
}
RAND_BPF = "4294963256"  # cBPF `ld rand`: SKF_AD_OFF (-0x1000) + SKF_AD_RANDOM (56) as u32
# the clsact egress filters of the faults, one priority each (a filter that does not
# match passes the packet on to the next)
FAULT_PRIO = {"loss": 1, "duplication": 2, "reordering": 3}
FAULT_KINDS = ("link_flap", "bandwidth_collapse", "jitter", "loss", "duplication",
               "reordering", "pause", "straggler", "link_dead")
PREFIX_RE = re.compile(r"^jss(\d+)x[a-z0-9]*_(sw|\d+)$")  # jss<pid>x<tag>_<i>

_live: set["EmulatedNetwork"] = set()
_live_lock = threading.Lock()


class NetworkError(RuntimeError):
    pass


def _run(cmd: list[str], timeout: float = CMD_TIMEOUT, check: bool = True,
         input: str | None = None) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, input=input)
    except subprocess.TimeoutExpired as e:
        raise NetworkError(f"timed out after {timeout}s: {' '.join(cmd)}") from e
    if check and proc.returncode != 0:
        raise NetworkError(f"failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr.strip()}")
    return proc


def _tools() -> tuple[str | None, str | None]:
    return shutil.which("ip"), shutil.which("tc")


def list_namespaces() -> list[str]:
    ip, _ = _tools()
    if ip is None:
        return []
    out = _run([ip, "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def usable() -> tuple[bool, str]:
    """Whether this machine can build an emulated network: (ok, reason)."""
    if not sys.platform.startswith("linux"):
        return False, f"needs Linux network namespaces (platform is {sys.platform})"
    if os.geteuid() != 0:
        return False, "needs root (ip netns / tc); run as root, e.g. sudo -E .venv/bin/python ..."
    ip, tc = _tools()
    if ip is None or tc is None:
        return False, "needs iproute2 (`ip` and `tc` on PATH)"
    try:
        find_mpiexec(NetworkError)
    except NetworkError as e:
        return False, str(e)
    probe = EmulatedNetwork(1, rate_mbit=100, delay_ms=0.0, prefix=f"jss{os.getpid()}xprobe")
    try:
        probe.up()
    except NetworkError as e:
        return False, f"a trial namespace/veth/netem setup failed: {e}"
    finally:
        probe.down()
    return True, "ok"


def supported_faults() -> dict[str, str]:
    """Which fault mechanisms (and netem) this kernel supports: {mechanism: "ok" or the
    error}, tried on a one-rank network."""
    out: dict[str, str] = {}
    net = EmulatedNetwork(1, rate_mbit=100, prefix=f"jss{os.getpid()}xfaults")
    with net:
        trials = {
            "link_down_up": lambda: (net.link_down(0), net.link_up(0)),
            "tbf_rate_change": lambda: net.set_link_rate(0, 10),
            "loss (cBPF da drop)": lambda: net.set_loss(0, 0.5),
            "duplication (cBPF + mirred mirror)": lambda: net.set_duplication(0, 0.5),
            "reordering (cBPF + mirred to ifb)": lambda: net.set_reordering(0, 0.5),
            "pause (SIGSTOP/SIGCONT)": lambda: None,
            "netem": lambda: _run([_tools()[1], "-n", net.ns(0), "qdisc", "add", "dev", "lo",
                                   "root", "netem", "delay", "1ms"]),
        }
        for name, trial in trials.items():
            try:
                trial()
                out[name] = "ok"
            except NetworkError as e:
                out[name] = str(e).splitlines()[-1]
        net.clear_faults(0)
    return out


def cleanup_stale(verbose: bool = True) -> list[str]:
    """Deletes namespaces named like ours whose creating process is gone."""
    removed = []
    for ns in list_namespaces():
        m = PREFIX_RE.match(ns)
        if not m:
            continue
        pid = int(m.group(1))
        if pid != os.getpid() and Path(f"/proc/{pid}").exists():
            continue  # a run in progress
        _kill_ns_pids(ns)
        _run([_tools()[0], "netns", "del", ns], check=False)
        removed.append(ns)
        if verbose:
            print(f"removed stale namespace {ns}", flush=True)
    return removed


def _kill_ns_pids(ns: str) -> None:
    ip = _tools()[0]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = [int(p) for p in _run([ip, "netns", "pids", ns], check=False).stdout.split()
                if p.isdigit()]
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        for _ in range(20):  # bounded: up to 2 s
            if not _run([ip, "netns", "pids", ns], check=False).stdout.split():
                return
            time.sleep(0.1)


class EmulatedNetwork:
    """P namespaces on a bridge, each link shaped to ``rate_mbit`` with ``delay_ms`` latency.

    Use as a context manager::

        with EmulatedNetwork(4, rate_mbit=500, delay_ms=0.1) as net:
            proc = net.launch(["bench.py", "--x"], timeout=300)
            print(net.measure_rate())
    """

    def __init__(self, nranks: int, rate_mbit: float | None, delay_ms: float = 0.0, *,
                 prefix: str | None = None, subnet: int | None = None, mtu: int = 1500,
                 queue_bytes: int = 8 << 20, env: dict | None = None):
        if nranks < 1 or nranks > 250:
            raise ValueError("nranks must be in 1..250")
        self.nranks = nranks
        self.rate_mbit = rate_mbit          # None: no shaping (veth speed, CPU bound)
        self.delay_ms = float(delay_ms)
        self.prefix = prefix or f"jss{os.getpid()}x{secrets.token_hex(2)}"
        self.subnet = subnet if subnet is not None else 77
        self.mtu = mtu
        self.queue_bytes = queue_bytes
        self.env = dict(env or {})          # extra environment for every launch
        self._is_up = False
        self._old_handlers: dict[int, object] = {}

    # ------------------------------------------------------------------ names

    @property
    def switch(self) -> str:
        return f"{self.prefix}_sw"

    def ns(self, i: int) -> str:
        return f"{self.prefix}_{i}"

    def address(self, i: int) -> str:
        return f"10.{self.subnet}.0.{i + 1}"

    @property
    def namespaces(self) -> list[str]:
        return [self.ns(i) for i in range(self.nranks)] + [self.switch]

    def describe(self) -> dict:
        return {"nranks": self.nranks, "rate_mbit": self.rate_mbit, "delay_ms": self.delay_ms,
                "prefix": self.prefix, "qdisc": " ".join(self.qdisc_args()) or "none",
                "iface": IFACE, "mtu": self.mtu,
                "topology": "one bridge (switch namespace), one veth per rank; tbf on both "
                "ends of each veth (uplink and downlink)",
                "mpi_env": {k: v for k, v in MPI_ENV.items() if k.startswith(("MPIR", "FI_"))}}

    def burst_bytes(self) -> int:
        # tbf bucket: 256 KiB, or 1 ms at the rate if more (a bucket of one 64 KiB GSO
        # packet makes tbf segment every GSO packet, far below the rate at P = 8)
        return max(256 << 10, int(self.rate_mbit * 1e6 / 8 * 1e-3)) if self.rate_mbit else 0

    def qdisc_args(self) -> list[str]:
        """The root qdisc on each end of each link (tbf), as tc arguments."""
        if not self.rate_mbit:
            return []
        return ["tbf", "rate", f"{self.rate_mbit:g}mbit", "burst", str(self.burst_bytes()),
                "limit", str(self.queue_bytes)]

    def _shape(self, tc: str, ns: str, dev: str) -> None:
        hop_delay_us = self.delay_ms * 1000 / 2
        if self.rate_mbit:
            _run([tc, "-n", ns, "qdisc", "replace", "dev", dev, "root", "handle", "1:",
                  *self.qdisc_args()])
        if hop_delay_us > 0:
            parent = ["parent", "1:1"] if self.rate_mbit else ["root"]
            try:
                _run([tc, "-n", ns, "qdisc", "add", "dev", dev, *parent, "handle", "10:",
                      "netem", "delay", f"{hop_delay_us:.0f}us", "limit", "100000"])
            except NetworkError as e:
                raise NetworkError(
                    f"delay_ms={self.delay_ms} needs the netem qdisc (CONFIG_NET_SCH_NETEM), "
                    f"which this kernel lacks; use delay_ms=0 (the latency is then the software "
                    f"stack's, measured by measure_latency()).\n{e}") from None

    # ------------------------------------------------------------------ lifecycle

    def up(self) -> "EmulatedNetwork":
        if self._is_up:
            return self
        ip, tc = _tools()
        if ip is None or tc is None:
            raise NetworkError("iproute2 (ip, tc) not found")
        with _live_lock:
            _live.add(self)
        self._is_up = True
        try:
            sw = self.switch
            _run([ip, "netns", "add", sw])
            _run([ip, "-n", sw, "link", "set", "lo", "up"])
            _run([ip, "-n", sw, "link", "add", BRIDGE, "type", "bridge"])
            # no STP, forward at once
            _run([ip, "-n", sw, "link", "set", BRIDGE, "type", "bridge", "stp_state", "0",
                  "forward_delay", "0"], check=False)
            _run([ip, "-n", sw, "link", "set", BRIDGE, "up"])
            for i in range(self.nranks):
                ns, port = self.ns(i), f"port{i}"
                _run([ip, "netns", "add", ns])
                _run([ip, "-n", ns, "link", "set", "lo", "up"])
                # created directly in the two namespaces: nothing appears in the root namespace
                _run([ip, "link", "add", IFACE, "netns", ns, "mtu", str(self.mtu), "type", "veth",
                      "peer", "name", port, "netns", sw, "mtu", str(self.mtu)])
                _run([ip, "-n", sw, "link", "set", port, "master", BRIDGE])
                _run([ip, "-n", sw, "link", "set", port, "up"])
                _run([ip, "-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", IFACE])
                _run([ip, "-n", ns, "link", "set", IFACE, "up"])
                self._shape(tc, ns, IFACE)     # uplink: rank -> switch
                self._shape(tc, sw, port)      # downlink: switch -> rank
        except BaseException:
            self.down()
            raise
        return self

    def down(self) -> None:
        """Kills what still runs inside our namespaces and deletes them. Idempotent."""
        if not self._is_up:
            return
        ip = _tools()[0]
        existing = set(list_namespaces())
        for ns in self.namespaces:
            if ns in existing:
                try:
                    _kill_ns_pids(ns)
                finally:
                    _run([ip, "netns", "del", ns], check=False)
        self._is_up = False
        with _live_lock:
            _live.discard(self)

    def _on_signal(self, signum, frame):
        self.down()
        old = self._old_handlers.get(signum)
        if callable(old):
            old(signum, frame)
        raise KeyboardInterrupt(f"signal {signum}")

    def __enter__(self) -> "EmulatedNetwork":
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGHUP):
                self._old_handlers[sig] = signal.signal(sig, self._on_signal)
        try:
            return self.up()
        except BaseException:
            self._restore_handlers()
            raise

    def _restore_handlers(self) -> None:
        for sig, h in self._old_handlers.items():
            signal.signal(sig, h if h is not None else signal.SIG_DFL)
        self._old_handlers.clear()

    def __exit__(self, *exc) -> None:
        try:
            self.down()
        finally:
            self._restore_handlers()

    # ------------------------------------------------------------------ counters

    def counters(self) -> dict[str, dict[str, int]]:
        """Bytes/packets through each rank's veth (from the rank's side), from the kernel."""
        ip = _tools()[0]
        out = {}
        for i in range(self.nranks):
            data = json.loads(_run([ip, "-n", self.ns(i), "-s", "-j", "link", "show", "dev",
                                    IFACE]).stdout)[0]["stats64"]
            out[self.ns(i)] = {"tx_bytes": data["tx"]["bytes"], "rx_bytes": data["rx"]["bytes"],
                               "tx_packets": data["tx"]["packets"],
                               "rx_packets": data["rx"]["packets"]}
        return out

    def qdisc_stats(self) -> dict[str, str]:
        tc = _tools()[1]
        return {self.ns(i): _run([tc, "-n", self.ns(i), "-s", "qdisc", "show", "dev", IFACE]
                                 ).stdout.strip() for i in range(self.nranks)}

    # ------------------------------------------------------------------ faults

    def _link_ends(self, i: int) -> list[tuple[str, str]]:
        """(namespace, device) of both ends of rank i's link: its uplink and downlink."""
        if not 0 <= i < self.nranks:
            raise ValueError(f"rank {i} is not in 0..{self.nranks - 1}")
        return [(self.ns(i), IFACE), (self.switch, f"port{i}")]

    def link_down(self, i: int) -> None:
        """Takes rank i's link down: its switch port (the rank's veth loses carrier)."""
        self._link_ends(i)
        _run([_tools()[0], "-n", self.switch, "link", "set", f"port{i}", "down"])

    def link_up(self, i: int) -> None:
        self._link_ends(i)
        _run([_tools()[0], "-n", self.switch, "link", "set", f"port{i}", "up"])

    def set_link_rate(self, i: int, rate_mbit: float | None) -> None:
        """Reshapes both directions of rank i's link to ``rate_mbit`` (None: as built)."""
        tc = _tools()[1]
        for ns, dev in self._link_ends(i):
            if rate_mbit is None and not self.rate_mbit:
                _run([tc, "-n", ns, "qdisc", "del", "dev", dev, "root"], check=False)
                continue
            rate = rate_mbit if rate_mbit is not None else self.rate_mbit
            burst = max(16 << 10, int(rate * 1e6 / 8 * 1e-3))  # 1 ms at the rate, >= 16 KiB
            if rate_mbit is None:
                burst = self.burst_bytes()
            _run([tc, "-n", ns, "qdisc", "replace", "dev", dev, "root", "handle", "1:", "tbf",
                  "rate", f"{rate:g}mbit", "burst", str(burst), "limit", str(self.queue_bytes)])

    def jitter(self, i: int, low_mbit: float, duration_s: float, period_s: float = 0.05,
               seed: int = 0) -> int:
        """For ``duration_s``, switches rank i's link between its rate and ``low_mbit``
        at random every ``period_s`` (a queueing delay that comes and goes); returns
        the number of changes. Blocks; ends with the link at its built rate."""
        import random

        rng = random.Random(seed)
        changes, end = 0, time.monotonic() + duration_s
        try:
            while time.monotonic() < end:
                self.set_link_rate(i, low_mbit if rng.random() < 0.5 else None)
                changes += 1
                time.sleep(period_s * rng.uniform(0.5, 1.5))
        finally:
            self.set_link_rate(i, None)
        return changes

    def _clsact(self, ns: str, dev: str) -> None:
        tc = _tools()[1]
        shown = _run([tc, "-n", ns, "qdisc", "show", "dev", dev]).stdout
        if "clsact" not in shown:
            _run([tc, "-n", ns, "qdisc", "add", "dev", dev, "clsact"])

    @staticmethod
    def _random_bpf(probability: float, hit: int, miss: int) -> str:
        """Classic BPF: ``hit`` for a random fraction ``probability`` of packets, else ``miss``."""
        if not 0.0 < probability < 1.0:
            raise ValueError(f"probability must be in (0, 1), got {probability}")
        threshold = min((1 << 32) - 2, int(round((1.0 - probability) * (1 << 32))) - 1)
        return f"4,32 0 0 {RAND_BPF},37 0 1 {threshold},6 0 0 {hit},6 0 0 {miss}"

    def _clear_filter(self, i: int, kind: str) -> None:
        tc = _tools()[1]
        for ns, dev in self._link_ends(i):
            _run([tc, "-n", ns, "filter", "del", "dev", dev, "egress", "prio",
                  str(FAULT_PRIO[kind])], check=False)

    def set_loss(self, i: int, probability: float | None) -> None:
        """Drops a random fraction of the packets on both directions of rank i's link
        (None: stops). A direct-action cBPF filter: 2 is TC_ACT_SHOT, -1 TC_ACT_UNSPEC."""
        self._clear_filter(i, "loss")
        if probability is None:
            return
        tc = _tools()[1]
        prog = self._random_bpf(probability, 2, 0xFFFFFFFF)
        for ns, dev in self._link_ends(i):
            self._clsact(ns, dev)
            _run([tc, "-n", ns, "filter", "add", "dev", dev, "egress", "prio",
                  str(FAULT_PRIO["loss"]), "bpf", "da", "bytecode", prog])

    def set_duplication(self, i: int, probability: float | None) -> None:
        """Sends a random fraction of the packets twice on both directions of rank i's link."""
        self._clear_filter(i, "duplication")
        if probability is None:
            return
        tc = _tools()[1]
        prog = self._random_bpf(probability, 0xFFFFFFFF, 0)  # -1: matched, 0: not
        for ns, dev in self._link_ends(i):
            self._clsact(ns, dev)
            _run([tc, "-n", ns, "filter", "add", "dev", dev, "egress", "prio",
                  str(FAULT_PRIO["duplication"]), "bpf", "bytecode", prog,
                  "action", "mirred", "egress", "mirror", "dev", dev])

    def _lane(self, i: int, ns: str) -> str:
        return "jssd0" if ns == self.ns(i) else f"jssd{i}"

    def set_reordering(self, i: int, probability: float | None, lane_mbit: float = 20.0) -> None:
        """Delays a random fraction of the packets on both directions of rank i's link:
        they take a detour through an ifb device shaped to ``lane_mbit`` (a queue of
        its own), so the packets behind them overtake them. None: stops."""
        self._clear_filter(i, "reordering")
        ip, tc = _tools()
        for ns, _ in self._link_ends(i):
            _run([ip, "-n", ns, "link", "del", self._lane(i, ns)], check=False)
        if probability is None:
            return
        prog = self._random_bpf(probability, 0xFFFFFFFF, 0)
        for ns, dev in self._link_ends(i):
            lane = self._lane(i, ns)
            _run([ip, "-n", ns, "link", "add", lane, "type", "ifb"])
            _run([ip, "-n", ns, "link", "set", lane, "up"])
            _run([tc, "-n", ns, "qdisc", "replace", "dev", lane, "root", "tbf", "rate",
                  f"{lane_mbit:g}mbit", "burst", str(self.mtu + 100), "limit",
                  str(self.queue_bytes)])
            self._clsact(ns, dev)
            _run([tc, "-n", ns, "filter", "add", "dev", dev, "egress", "prio",
                  str(FAULT_PRIO["reordering"]), "bpf", "bytecode", prog,
                  "action", "mirred", "egress", "redirect", "dev", lane])

    def clear_faults(self, i: int) -> None:
        """Removes every fault from rank i's link: up, built rate, no filters."""
        self.set_loss(i, None)
        self.set_duplication(i, None)
        self.set_reordering(i, None)
        tc = _tools()[1]
        for ns, dev in self._link_ends(i):  # and the clsact hook, whose drop counter goes with it
            _run([tc, "-n", ns, "qdisc", "del", "dev", dev, "clsact"], check=False)
        self.set_link_rate(i, None)
        self.link_up(i)

    def fault_counts(self, i: int) -> dict[str, int]:
        """What the kernel counted on both ends of rank i's link: packets dropped by the
        loss filter (clsact's drops), copies made by the duplication filter, packets sent
        through the reordering lane."""
        tc = _tools()[1]
        counts = {"dropped": 0, "duplicated": 0, "delayed": 0}
        for ns, dev in self._link_ends(i):
            for q in json.loads(_run([tc, "-n", ns, "-s", "-j", "qdisc", "show", "dev", dev]
                                     ).stdout or "[]"):
                if q.get("kind") == "clsact":
                    counts["dropped"] += int(q.get("drops", 0))
            text = _run([tc, "-n", ns, "-s", "filter", "show", "dev", dev, "egress", "prio",
                         str(FAULT_PRIO["duplication"])], check=False).stdout
            counts["duplicated"] += sum(int(m) for m in re.findall(r"Sent \d+ bytes (\d+) pkt",
                                                                  text))
            lane = json.loads(_run([tc, "-n", ns, "-s", "-j", "qdisc", "show", "dev",
                                    self._lane(i, ns)], check=False).stdout or "[]")
            counts["delayed"] += sum(int(q.get("packets", 0)) for q in lane)
        return counts

    def rank_pids(self, i: int) -> list[int]:
        """The processes inside rank i's namespace (the rank's Python)."""
        return [int(p) for p in _run([_tools()[0], "netns", "pids", self.ns(i)],
                                     check=False).stdout.split() if p.isdigit()]

    def pause_rank(self, i: int) -> list[int]:
        """SIGSTOPs rank i's processes (as a debugger or a swapped-out node would)."""
        pids = self.rank_pids(i)
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        return pids

    def resume_rank(self, i: int) -> None:
        for pid in self.rank_pids(i):
            os.kill(pid, signal.SIGCONT)

    def inject(self, kind: str, i: int, duration_s: float | None, **params) -> dict:
        """Injects one fault of ``FAULT_KINDS`` on rank i's link (or rank), holds it
        ``duration_s`` seconds (blocking) and removes it; ``None``: leaves it on
        (``link_dead``). Returns what was done and the kernel's counts.

        ``params``: ``probability`` (loss, duplication, reordering), ``rate_mbit``
        (bandwidth_collapse), ``low_mbit`` and ``period_s`` (jitter), ``lane_mbit``
        (reordering); each has a default. ``straggler`` only sleeps here (the caller slows
        its compute).
        """
        if kind not in FAULT_KINDS:
            raise ValueError(f"kind must be one of {FAULT_KINDS}, got {kind!r}")
        rate = self.rate_mbit or 1000.0
        info: dict = {"kind": kind, "rank": i, "duration_s": duration_s,
                      "t_start": time.time()}
        hold = duration_s if duration_s is not None else 0.0
        try:
            if kind in ("link_flap", "link_dead"):
                self.link_down(i)
                info["t_applied"] = time.time()
                if kind == "link_dead":
                    return info
                time.sleep(hold)
            elif kind == "bandwidth_collapse":
                info["rate_mbit"] = params.get("rate_mbit", rate / 100)
                self.set_link_rate(i, info["rate_mbit"])
                time.sleep(hold)
            elif kind == "jitter":
                info["low_mbit"] = params.get("low_mbit", rate / 50)
                info["rate_changes"] = self.jitter(i, info["low_mbit"], hold,
                                                   params.get("period_s", 0.05))
            elif kind in ("loss", "duplication", "reordering"):
                p = params.get("probability", {"loss": 0.02, "duplication": 0.05,
                                               "reordering": 0.1}[kind])
                info["probability"] = p
                setter = {"loss": self.set_loss, "duplication": self.set_duplication,
                          "reordering": self.set_reordering}[kind]
                extra = {"lane_mbit": params["lane_mbit"]} if "lane_mbit" in params else {}
                setter(i, p, **extra)
                time.sleep(hold)
                info["counts"] = self.fault_counts(i)
            elif kind == "pause":
                info["pids"] = self.pause_rank(i)
                time.sleep(hold)
            else:  # straggler
                time.sleep(hold)
        finally:
            if kind == "pause":
                self.resume_rank(i)
            elif kind != "link_dead":
                self.clear_faults(i)
            info["t_end"] = time.time()
        return info

    # ------------------------------------------------------------------ launching

    def command(self, args: list[str], nranks: int | None = None,
                python: str | None = None, mpiexec_args: list[str] | None = None) -> list[str]:
        """The MPMD mpiexec command line: one rank per namespace, ``python args``."""
        n = self.nranks if nranks is None else nranks
        if not 1 <= n <= self.nranks:
            raise ValueError(f"nranks must be in 1..{self.nranks}")
        ip = _tools()[0]
        cmd = [find_mpiexec(NetworkError), *(mpiexec_args or [])]
        for i in range(n):
            if i:
                cmd.append(":")
            cmd += ["-n", "1", ip, "netns", "exec", self.ns(i), python or sys.executable, *args]
        return cmd

    def launch(self, args: list[str], timeout: float, nranks: int | None = None,
               env: dict | None = None, capture: bool = True, cwd: str | None = None,
               stream: bool = False) -> subprocess.CompletedProcess:
        """Runs ``python args`` on every rank (one per namespace) under mpiexec; past
        ``timeout`` seconds kills the job and raises ``NetworkError``. ``stream``: echo the
        output as it comes."""
        if not self._is_up:
            raise NetworkError("network is not up")
        full_env = {**os.environ, **MPI_ENV, **self.env, **(env or {})}
        cmd = self.command(args, nranks)
        proc = subprocess.Popen(cmd, env=full_env, cwd=cwd, start_new_session=True,
                                stdout=subprocess.PIPE if (capture or stream) else None,
                                stderr=subprocess.STDOUT if (capture or stream) else None,
                                text=True)
        chunks: list[str] = []

        def pump():
            for line in proc.stdout:
                chunks.append(line)
                if stream:
                    print(line, end="", flush=True)

        reader = None
        if capture or stream:
            reader = threading.Thread(target=pump, daemon=True)
            reader.start()
        try:
            rc = proc.wait(timeout=timeout)
        except BaseException as e:
            self._kill_job(proc)
            if reader:
                reader.join(timeout=5)
            if isinstance(e, subprocess.TimeoutExpired):
                raise NetworkError(f"timed out after {timeout}s: {' '.join(cmd[:12])} ...\n"
                                   + "".join(chunks)[-4000:]) from None
            raise
        if reader:
            reader.join(timeout=10)
        return subprocess.CompletedProcess(cmd, rc, "".join(chunks), "")

    def _kill_job(self, proc: subprocess.Popen) -> None:
        kill_group(proc)
        for ns in self.namespaces:
            _kill_ns_pids(ns)

    # ------------------------------------------------------------------ rate probe

    def measure_rate(self, nbytes: int = 16 << 20, repeats: int = 3, timeout: float = 120,
                     nranks: int | None = None, allreduce: bool = True) -> dict:
        """Achieved rates and latency, with MPI through the emulated network: ``pingpong``
        (8-byte round trips between ranks 0 and 1: the one-way latency, the cost model's
        alpha, from the fastest repeat), ``sendrecv`` (ranks 0 and 1 exchange ``nbytes``:
        ``achieved_mbit``, the payload rate per direction) and, with ``allreduce``, an
        ``nbytes`` MPI_Allreduce over ``nranks`` ranks (``mbit`` = 2 (P-1)/P * nbytes * 8 /
        time). Each checks from the veths' counters that the payload went over them
        (``went_over_veth``); medians over ``repeats`` calls after one warm-up (max over
        ranks per call)."""
        n = self.nranks if nranks is None else nranks
        res: dict = {"nbytes": nbytes, "configured_mbit": self.rate_mbit,
                     "delay_ms": self.delay_ms}
        with tempfile.TemporaryDirectory(prefix="jssprobe") as tmp:
            script = Path(tmp) / "probe.py"
            script.write_text(PROBE_SCRIPT)
            os.chmod(tmp, 0o755)
            for mode, p, size in (("pingpong", 2, 8), ("sendrecv", 2, nbytes),
                                  ("allreduce", n, nbytes)):
                if p < 2 or p > self.nranks or (mode == "allreduce" and not allreduce):
                    continue
                out = Path(tmp) / f"{mode}.json"
                before = self.counters()
                proc = self.launch([str(script), mode, str(size), str(repeats), str(out)],
                                   timeout=timeout, nranks=p)
                after = self.counters()
                if proc.returncode != 0 or not out.exists():
                    raise NetworkError(f"rate probe ({mode}) failed:\n{proc.stdout[-3000:]}")
                r = json.loads(out.read_text())
                tx = [after[k]["tx_bytes"] - before[k]["tx_bytes"] for k in list(after)[:p]]
                r["veth_tx_bytes"] = tx
                r["payload_bytes_per_rank"] = r["payload_bytes"]
                r["went_over_veth"] = min(tx) >= r["payload_bytes"]
                res[mode] = r
        sr = res.get("sendrecv")
        res["achieved_mbit"] = sr["mbit"] if sr else None
        pp = res.get("pingpong")
        res["one_way_latency_s"] = pp["one_way_latency_s"] if pp else None
        res["achieved_fraction"] = (sr["mbit"] / self.rate_mbit) if (sr and self.rate_mbit) else None
        return res


# A tiny MPI program, run in the namespaces by measure_rate().
PROBE_SCRIPT = r'''
import json, sys, time
import numpy as np
from mpi4py import MPI
mode, nbytes, repeats, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
c = MPI.COMM_WORLD
r, p = c.Get_rank(), c.Get_size()
a = np.ones(nbytes // 4, np.float32)
b = np.empty_like(a)
times = []
for it in range(repeats + 1):          # the first is a warm-up (connection setup)
    c.Barrier()
    t0 = time.perf_counter()
    if mode == "sendrecv":
        peer = 1 - r
        c.Sendrecv(a, dest=peer, recvbuf=b, source=peer)
    elif mode == "pingpong":      # nbytes-byte messages back and forth, 200 round trips
        for _ in range(200):
            if r == 0:
                c.Send(a, dest=1); c.Recv(b, source=1)
            elif r == 1:
                c.Recv(b, source=0); c.Send(a, dest=0)
    else:
        c.Allreduce(a, b)
    t = c.allreduce(time.perf_counter() - t0, op=MPI.MAX)
    if it:
        times.append(t)
if r == 0:
    med = sorted(times)[len(times) // 2]
    if mode == "pingpong":
        # the fastest repeat: the link's latency, least disturbed by other processes
        json.dump({"mode": mode, "P": p, "nbytes": a.nbytes, "times_s": times,
                   "one_way_latency_s": min(times) / 400,
                   "one_way_latency_median_s": med / 400, "payload_bytes": 0}, open(out, "w"))
    else:
        vol = a.nbytes if mode == "sendrecv" else 2 * (p - 1) / p * a.nbytes
        json.dump({"mode": mode, "P": p, "times_s": times, "median_s": med,
                   "bytes_per_rank_per_call": vol, "payload_bytes": (repeats + 1) * vol,
                   "mbit": vol * 8 / med / 1e6}, open(out, "w"))
'''


@atexit.register
def _teardown_all() -> None:
    with _live_lock:
        nets = list(_live)
    for net in nets:
        try:
            net.down()
        except Exception as e:  # pragma: no cover
            print(f"emulated_network: teardown of {net.prefix} failed: {e}", file=sys.stderr)


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="usable()? then build 2 ranks and probe")
    ap.add_argument("--measure", action="store_true", help="measure the achieved rate")
    ap.add_argument("--cleanup", action="store_true", help="delete stale namespaces of dead runs")
    ap.add_argument("--nranks", type=int, default=2)
    ap.add_argument("--rate", type=float, default=200.0, help="Mbit/s per link direction (0: none)")
    ap.add_argument("--delay-ms", type=float, default=0.0)
    ap.add_argument("--nbytes", type=int, default=16 << 20)
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--faults", action="store_true", help="which fault kinds this kernel supports")
    ap.add_argument("--fault", default=None, metavar="KIND[=VALUE]",
                    help="with --measure: on link 0 during the measurement: loss=P, "
                    "duplication=P, reordering=P (probabilities) or rate=MBIT")
    args = ap.parse_args(argv)
    if args.cleanup:
        cleanup_stale()
        return 0
    if args.faults:
        print(json.dumps(supported_faults(), indent=1))
        return 0
    ok, why = usable()
    print(f"usable: {ok} ({why})", flush=True)
    if not ok:
        return 1
    if args.check or args.measure:
        with EmulatedNetwork(args.nranks, args.rate or None, args.delay_ms) as net:
            print(json.dumps(net.describe(), indent=1))
            if args.fault:
                kind, _, value = args.fault.partition("=")
                setters = {"loss": net.set_loss, "duplication": net.set_duplication,
                           "reordering": net.set_reordering, "rate": net.set_link_rate}
                if kind not in setters or not value:
                    ap.error(f"--fault must be one of {sorted(setters)} =VALUE, got {args.fault!r}")
                setters[kind](0, float(value))
            res = net.measure_rate(args.nbytes, timeout=args.timeout)
            if args.fault:
                res["fault"] = {"spec": args.fault, "link": 0, "counts": net.fault_counts(0)}
            print(json.dumps(res, indent=1))
        left = [ns for ns in list_namespaces() if ns.startswith(net.prefix + "_")]
        print(f"torn down: {not left}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
