"""Layer grouping of the gradient sync: fusion (MG-WFBP), buckets and
simultaneous communications (ASC-WFBP).

The backward pass produces the gradient leaves one after the other. A
*grouping* cuts the leaves, in backward order, into consecutive groups; each
group is one sync operation (a sparse or dense allreduce of the group's
entries), and each group has a *kind*:

* ``"normal"``: it starts on the wire when it is ready **and** every earlier
  group has finished (WFBP's one-at-a-time link);
* ``"simultaneous"``: it starts as soon as it is ready, while earlier groups
  are still in flight (at most ``Link.max_concurrent`` groups at once; when
  that many are in flight, it waits for the oldest to end).

Groups start in their order (a group never starts before the one before it):
that is the order every rank issues its collectives in.

:func:`plan` builds the groups with one of :data:`GROUPINGS`:

=========  ================================================================
none       one group of every leaf (all fused, sent when the last is ready)
wfbp       one group per leaf, all normal (wait-free backpropagation)
mg         MG-WFBP: leaf l is merged into the next one while the merge rule
           (paper eq. 5) holds on the simulated timeline; all normal
bucket     Horovod / PyTorch-DDP buckets of at most ``bucket_mb`` MiB of
           dense bytes (a bigger leaf alone), all normal
asc        ASC-WFBP: Algorithm 1 of the paper decides each leaf's type
           (normal, merged, simultaneous), then the simulator has the last
           word: never predicted slower than any other method (see
           :func:`plan`); with ``min_gain > 0``, one group (ungrouped)
           unless grouping is predicted to gain more than ``min_gain``
=========  ================================================================

The model (Shi, Chu, Li: "Exploiting simultaneous communications to
accelerate data parallel distributed deep learning", Sections III-V):

* one operation of ``m`` bytes alone on the link: ``t_AR(m) = a + b m``;
* an operation spends ``a`` seconds of startup (not contended), then its bytes
  at ``b * slowdown(n)`` seconds per byte, where ``n`` is the number of
  operations in their byte phase at that moment and
  ``slowdown(n) = 1 + (gamma - 1)(n - 1)`` (two at once: ``gamma * b``, the
  paper's contention model, ``1 <= gamma <= 2`` in practice), and never
  faster together than the link itself when ``Link.link_b`` is given
  (``slowdown(n) >= n * link_b / b``). The rates are
  piecewise constant between events (a start, a startup's end, an end);
* a link with a burst (``Link.burst_s``, a token bucket: a shaper such as ``tc
  tbf``, a NIC's or TCP's first window) passes the first bytes of an operation
  that starts on an idle link at once: its byte work is shortened by
  ``min(burst_s, time the link has been idle, its byte work)``; the link is idle
  from the step's start (a full bucket) until the first operation starts and
  whenever no operation is in flight;
* the message of a group is ``message_bytes(entries)``, passed by the caller:
  for a sparse sync it is the *compressed* size of the group's selection
  (e.g. ``8 * density * entries`` plus headers), not its dense size;
* local work is serial with the backward pass (the selection and
  accumulation of a group run on the cores that compute the gradients): when
  a group's last leaf is ready, ``local_s(entries)`` seconds of local work run
  and delay everything computed after it. With ``r_j`` the ready time of leaf
  ``j`` and ``D_g`` the local work of the groups before group ``g``,
  ``ready_g = r_last(g) + D_g + local_s(entries_g)`` and the backward pass
  ends at ``compute_s + sum_g local_s(entries_g)``;
* a normal group starts at ``max(ready_g, end of every earlier group)``, a
  simultaneous one at ``max(ready_g, start of the group before it, end of
  the oldest group in flight if max_concurrent are)``; the step's
  sync ends at ``predicted_s = max(end of the backward pass with local work,
  last wire end)``.

Algorithm 1 of the paper (``asc``), leaf by leaf in backward order on the
simulated timeline of the current plan: with ``tau_c`` and ``t_c`` the start
and duration of the group leaf l ends, ``r`` that group's ready time and
``r'`` the ready time of the next leaf,

* Q1: ``tau_c + t_c <= r'`` (the communication hides behind the next leaf);
* Q2: ``r' < tau_c + a`` (MG-WFBP's merge rule, eq. 5);
* Q3: ``r + a + b m + (gamma - 1) b m_prev (1 - (r - tau_c_prev) / (a + b
  m_prev)) < r'`` (started at once, with the eq. 13 penalty of overlapping the
  group before, it still ends before the next leaf is ready);
* Q4: ``tau_c < r'`` (only splits the MG case of the proof);

Theorem 1: normal if Q1, merged into the next leaf if ``not Q1 and Q2 and
not Q3``, simultaneous otherwise.

:func:`simulate` is the single source of every prediction: each method's plan
(and every candidate the planners compare) is timed by the same small
event-driven simulation, so the plans are comparable.

Example (1 ms startup, 1 MB/s; groups 1 and 2 start while the one before is
still on the wire, which MG-WFBP's one-at-a-time link cannot do):
  >>> from jax_sparse_sync.model import grouping as gp
  >>> layers = gp.LayerTimes(leaves=(4, 3, 2, 1, 0),
  ...                        ready_s=(0.001, 0.002, 0.004, 0.006, 0.008),
  ...                        entries=(3000, 500, 2000, 500, 1500),
  ...                        dense_bytes=(12000, 2000, 8000, 2000, 6000), compute_s=0.009,
  ...                        names=("head.w", "head.b", "mlp.w", "mlp.b", "embed"))
  >>> link = gp.Link(a=1e-3, b=1e-6, gamma=1.5)
  >>> asc = gp.plan("asc", layers, link, message_bytes=lambda n: float(n))
  >>> asc.leaf_groups(), [g.kind for g in asc.groups]
  (((4,), (3, 2), (1,), (0,)), ['normal', 'simultaneous', 'simultaneous', 'normal'])
  >>> [round(gp.plan(m, layers, link, float).predicted_s * 1e3, 3) for m in gp.GROUPINGS]
  [16.5, 13.5, 11.5, 16.5, 10.5]
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Callable, Sequence

__all__ = ["GROUPINGS", "Link", "LayerTimes", "Group", "GroupingPlan", "simulate", "plan"]

#: The grouping methods :func:`plan` knows (``method=``), each described there.
GROUPINGS = ("none", "wfbp", "mg", "bucket", "asc")
_KINDS = ("normal", "simultaneous")


def _finite(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)


def _count(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool) and x >= 0


@dataclasses.dataclass(frozen=True)
class Link:
    """The alpha-beta-gamma model of one sync operation of a group.

    Attributes:
      a: startup seconds of one operation (not contended).
      b: seconds per byte of one operation alone on the link.
      gamma: contention: with ``n`` operations in their byte phase at once, each
        runs at ``slowdown(n) = 1 + (gamma - 1) * (n - 1)`` times ``b`` per byte
        (``n = 2``: ``gamma * b``, the paper's model). ``gamma >= 1``.
      max_concurrent: at most this many groups in flight; a later one waits
        for the oldest: a simultaneous group starts only when fewer than
        ``max_concurrent`` groups were started since the oldest one still in
        flight, itself included (an executor that keeps its handles in a FIFO
        and waits on the oldest when it holds ``max_concurrent``).
      link_b: seconds per byte of the link itself, the bound on all the
        operations' bytes together: ``n`` operations in their byte phase each
        run at ``b * max(slowdown(n), n * link_b / b)`` per byte. ``None`` (the
        default): no bound, the contention model alone. Why: with ``gamma < 2``
        the model alone has two operations move ``2 / gamma`` times the bytes
        of one, which exceeds the link when one operation already fills it
        (ASC-WFBP's ``b`` is the link rate: eq. 43's ``t_c^min = 2 m / B`` is
        ``b m``), and then predicts a step faster than the paper's own bound
        S_max.
      burst_s: seconds of bytes (``b`` times the bucket's bytes) that an
        operation starting on an idle link passes at once: a token bucket of
        ``burst_s / b`` bytes, refilled at the link's rate while no operation is
        in flight (full at the step's start). 0 (the default): none. For
        example a ``tc tbf`` shaper's 256 KiB bucket on a 200 Mbit/s link is
        ``burst_s = 256 * 1024 * 8 / 200e6``, about 10.5 ms.

    Numbers are stored as ``float`` (``max_concurrent`` as ``int``).
    """

    a: float
    b: float
    gamma: float = 1.0
    max_concurrent: int = 2
    link_b: float | None = None
    burst_s: float = 0.0

    def __post_init__(self):
        if not (_finite(self.a) and self.a >= 0):
            raise ValueError(f"Link.a must be a finite number >= 0; got {self.a!r}")
        if not (_finite(self.b) and self.b >= 0):
            raise ValueError(f"Link.b must be a finite number >= 0; got {self.b!r}")
        if not (_finite(self.gamma) and self.gamma >= 1):
            raise ValueError(f"Link.gamma must be a finite number >= 1; got {self.gamma!r}")
        if not (_count(self.max_concurrent) and self.max_concurrent >= 1):
            raise ValueError(f"Link.max_concurrent must be an int >= 1; got "
                             f"{self.max_concurrent!r}")
        if self.link_b is not None and not (_finite(self.link_b) and self.link_b >= 0):
            raise ValueError(f"Link.link_b must be None or a finite number >= 0; got "
                             f"{self.link_b!r}")
        if not (_finite(self.burst_s) and self.burst_s >= 0):
            raise ValueError(f"Link.burst_s must be a finite number >= 0 (seconds of bytes a "
                             f"link idle long enough passes at once; 0: none); got "
                             f"{self.burst_s!r}")
        for field in ("a", "b", "gamma", "burst_s"):
            object.__setattr__(self, field, float(getattr(self, field)))
        if self.link_b is not None:
            object.__setattr__(self, "link_b", float(self.link_b))
        object.__setattr__(self, "max_concurrent", int(self.max_concurrent))

    def slowdown(self, n: int) -> float:
        """Per-byte slowdown of each of ``n`` operations in their byte phase at once
        (``1 + (gamma - 1)(n - 1)``, at least ``n * link_b / b`` with a ``link_b``)."""
        s = 1.0 + (self.gamma - 1.0) * (n - 1) if n > 1 else 1.0
        if self.link_b is not None and n > 1 and self.b > 0:
            s = max(s, n * self.link_b / self.b)
        return s


@dataclasses.dataclass(frozen=True)
class LayerTimes:
    """When each gradient leaf exists and how big it is, in BACKWARD order.

    Attributes:
      leaves: leaf ids (the caller's tree-order indices), first ready first.
      ready_s: seconds from the step's start at which each leaf's gradient
        exists (non-decreasing).
      entries: entries (numbers) of each leaf.
      dense_bytes: dense bytes of each leaf (for the ``bucket`` method).
      compute_s: end of the backward pass (``>= ready_s[-1]``).
      names: optional leaf names (for :meth:`GroupingPlan.table`), same order.

    Sequences are stored as tuples (of ``int`` / ``float``: NumPy scalars are
    accepted and converted).
    """

    leaves: tuple[int, ...]
    ready_s: tuple[float, ...]
    entries: tuple[int, ...]
    dense_bytes: tuple[int, ...]
    compute_s: float
    names: tuple[str, ...] = ()

    def __post_init__(self):
        for field in ("leaves", "ready_s", "entries", "dense_bytes", "names"):
            object.__setattr__(self, field, tuple(getattr(self, field)))
        n = len(self.leaves)
        for field in ("ready_s", "entries", "dense_bytes"):
            if len(getattr(self, field)) != n:
                raise ValueError(f"LayerTimes.{field} has {len(getattr(self, field))} items, "
                                 f"leaves has {n}")
        if self.names and len(self.names) != n:
            raise ValueError(f"LayerTimes.names has {len(self.names)} items, leaves has {n}")
        for i, x in enumerate(self.leaves):
            if not (isinstance(x, numbers.Integral) and not isinstance(x, bool)):
                raise ValueError(f"LayerTimes.leaves must hold int ids; item {i} is {x!r}")
        object.__setattr__(self, "leaves", tuple(int(x) for x in self.leaves))
        object.__setattr__(self, "names", tuple(str(x) for x in self.names))
        if len(set(self.leaves)) != n:
            raise ValueError(f"LayerTimes.leaves has a repeated id: {self.leaves}")
        prev = 0.0
        for i, r in enumerate(self.ready_s):
            if not (_finite(r) and float(r) >= prev):
                raise ValueError(f"LayerTimes.ready_s must be finite, >= 0 and non-decreasing; "
                                 f"item {i} is {r!r} after {prev!r}")
            prev = float(r)
        for field in ("entries", "dense_bytes"):
            for i, e in enumerate(getattr(self, field)):
                if not _count(e):
                    raise ValueError(f"LayerTimes.{field} must hold ints >= 0; item {i} is {e!r}")
        if not (_finite(self.compute_s) and float(self.compute_s) >= prev):
            raise ValueError(f"LayerTimes.compute_s must be finite and >= the last ready_s "
                             f"({prev!r}); got {self.compute_s!r}")
        object.__setattr__(self, "ready_s", tuple(float(r) for r in self.ready_s))
        object.__setattr__(self, "entries", tuple(int(e) for e in self.entries))
        object.__setattr__(self, "dense_bytes", tuple(int(e) for e in self.dense_bytes))
        object.__setattr__(self, "compute_s", float(self.compute_s))


@dataclasses.dataclass(frozen=True)
class Group:
    """One sync operation of a plan, with its predicted timeline.

    Attributes:
      leaves: leaf ids in backward order.
      kind: ``"normal"`` (starts when ready and every earlier group is done) or
        ``"simultaneous"`` (starts as soon as it is ready, while earlier ones
        are in flight).
      entries: entries of its leaves together.
      message_bytes: bytes on the wire (``message_bytes(entries)``).
      ready_s: predicted moment its last leaf is ready plus its local work.
      start_s: predicted wire start.
      end_s: predicted wire end.
      names: the names of its leaves (empty when the layers had none).
    """

    leaves: tuple[int, ...]
    kind: str
    entries: int
    message_bytes: float
    ready_s: float
    start_s: float
    end_s: float
    names: tuple[str, ...] = ()


def _abbreviate(items: Sequence[str], width: int = 36) -> str:
    text = ", ".join(items)
    if len(items) > 3 and len(text) > width:
        text = f"{items[0]}, {items[1]} .. {items[-1]} ({len(items)})"
    if len(text) > width:
        text = text[:width - 2] + ".."
    return text


@dataclasses.dataclass(frozen=True)
class GroupingPlan:
    """The groups of a method and the predicted end of the step's sync.

    Attributes:
      method: the method that built it (one of :data:`GROUPINGS`, or
        ``"custom"`` for :func:`simulate`'s own groups).
      groups: the groups, in backward order.
      compute_s: end of the backward pass without local work (the layers').
      predicted_s: predicted end of the step's sync: ``max(end of the
        backward pass with local work, last wire end)``.
      max_concurrent: the link's ``max_concurrent`` the plan was simulated
        with; ``grouped_topk_sync(plan)`` holds its simultaneous groups to
        it (``sparse_allreduce_start(max_in_flight=...)``).
    """

    method: str
    groups: tuple[Group, ...]
    compute_s: float
    predicted_s: float
    max_concurrent: int = 2

    def leaf_groups(self) -> tuple[tuple[int, ...], ...]:
        """The leaf ids of each group."""
        return tuple(g.leaves for g in self.groups)

    def table(self) -> str:
        """A readable table of the groups and the predicted time (times in ms)."""
        rows = [("#", "leaves", "entries", "bytes", "kind", "ready ms", "start ms", "end ms")]
        for i, g in enumerate(self.groups):
            labels = list(g.names) if g.names else [str(x) for x in g.leaves]
            rows.append((str(i), _abbreviate(labels), str(g.entries), f"{g.message_bytes:.0f}",
                         g.kind, f"{g.ready_s * 1e3:.3f}", f"{g.start_s * 1e3:.3f}",
                         f"{g.end_s * 1e3:.3f}"))
        widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
        left = (1, 4)
        lines = ["  ".join(cell.ljust(w) if c in left else cell.rjust(w)
                           for c, (cell, w) in enumerate(zip(r, widths))).rstrip() for r in rows]
        count = f"{len(self.groups)} group{'' if len(self.groups) == 1 else 's'}"
        lines.append(f"{self.method}: {count}, predicted {self.predicted_s * 1e3:.3f} ms "
                     f"(backward pass {self.compute_s * 1e3:.3f} ms)")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def to_json(self) -> dict:
        """A JSON-able dict (:meth:`from_json` reads it back exactly)."""
        return {"method": self.method, "compute_s": self.compute_s,
                "predicted_s": self.predicted_s, "max_concurrent": self.max_concurrent,
                "groups": [{"leaves": list(g.leaves), "kind": g.kind, "entries": g.entries,
                            "message_bytes": g.message_bytes, "ready_s": g.ready_s,
                            "start_s": g.start_s, "end_s": g.end_s, "names": list(g.names)}
                           for g in self.groups]}

    @classmethod
    def from_json(cls, d: dict) -> GroupingPlan:
        """The plan :meth:`to_json` wrote."""
        groups = tuple(Group(leaves=tuple(int(x) for x in g["leaves"]), kind=str(g["kind"]),
                             entries=int(g["entries"]), message_bytes=float(g["message_bytes"]),
                             ready_s=float(g["ready_s"]), start_s=float(g["start_s"]),
                             end_s=float(g["end_s"]), names=tuple(g.get("names", ())))
                       for g in d["groups"])
        for g in groups:
            if g.kind not in _KINDS:
                raise ValueError(f"from_json: unknown group kind {g.kind!r}; expected {_KINDS}")
        return cls(method=str(d["method"]), groups=groups, compute_s=float(d["compute_s"]),
                   predicted_s=float(d["predicted_s"]),
                   max_concurrent=int(d.get("max_concurrent", 2)))


# ---------------------------------------------------------------------------
# The simulation. Internally a grouping is `his` (the exclusive end index, in
# backward-order positions, of each group) and `kinds` (0 normal, 1
# simultaneous; the first group is always 0).


class _Model:
    """The layers, the link and the caller's (memoised) size functions."""

    def __init__(self, layers: LayerTimes, link: Link, message_bytes, local_s):
        if not isinstance(layers, LayerTimes):
            raise ValueError(f"layers must be a LayerTimes; got {type(layers).__name__}")
        if not isinstance(link, Link):
            raise ValueError(f"link must be a Link; got {type(link).__name__}")
        self.layers, self.link = layers, link
        self.ready = [float(r) for r in layers.ready_s]
        self.prefix = [0]
        for e in layers.entries:
            self.prefix.append(self.prefix[-1] + e)
        self._message_bytes, self._local_s = message_bytes, local_s
        self._mb: dict[int, float] = {}
        self._loc: dict[int, float] = {}

    def message_bytes(self, n: int) -> float:
        v = self._mb.get(n)
        if v is None:
            v = self._mb[n] = self._check("message_bytes", n, self._message_bytes(n))
        return v

    def local(self, n: int) -> float:
        v = self._loc.get(n)
        if v is None:
            v = self._loc[n] = self._check("local_s", n, self._local_s(n))
        return v

    @staticmethod
    def _check(name, n, v) -> float:
        try:
            v = float(v)
        except (TypeError, ValueError):
            raise ValueError(f"{name}({n}) returned {v!r}, not a number") from None
        if not (math.isfinite(v) and v >= 0):
            raise ValueError(f"{name}({n}) must be finite and >= 0; got {v!r}")
        return v


class _Eval:
    """One simulated grouping: compute timeline, wire timeline, snapshots."""

    __slots__ = ("his", "kinds", "ready", "work", "shift_after", "compute_end", "starts", "ends",
                 "snaps", "predicted")


def _evaluate(model: _Model, his: list[int], kinds: list[int], base: _Eval | None = None,
              from_g: int = 0, sync: int | None = None) -> _Eval:
    """Simulates the grouping ``(his, kinds)``.

    With ``base``, a grouping equal to this one in its groups ``< from_g`` and,
    from group ``sync`` on, equal to ``base``'s last groups (offset by the
    difference in group counts), the simulation resumes from ``base``'s state
    right after group ``from_g - 1`` started and stops as soon as its state
    equals ``base``'s (then the rest is ``base``'s). Either way the result is
    the same, bit for bit, as a fresh simulation: the loop is deterministic.
    """
    link = model.link
    n_groups = len(his)
    if base is None or from_g <= 0:
        base, from_g, sync = None, 0, None
    if base is not None:
        delta = len(base.his) - n_groups
        if sync is None:
            sync = n_groups
        ready, work = base.ready[:from_g], base.work[:from_g]
        shift_after = base.shift_after[:from_g]
    else:
        delta = 0
        ready, work, shift_after = [], [], []
    shift = shift_after[-1] if shift_after else 0.0
    lo = his[from_g - 1] if from_g else 0
    aligned = False
    prefix, leaf_ready, loc, mb, b = model.prefix, model.ready, model._loc, model._mb, link.b
    for g in range(from_g, n_groups):
        if base is not None and g == sync and (
                shift == (base.shift_after[g + delta - 1] if g + delta else 0.0)):
            ready += base.ready[g + delta:]
            work += base.work[g + delta:]
            shift_after += base.shift_after[g + delta:]
            aligned = True
            break
        hi = his[g]
        n = prefix[hi] - prefix[lo]
        d = loc.get(n)
        if d is None:
            d = model.local(n)
        m = mb.get(n)
        if m is None:
            m = model.message_bytes(n)
        ready.append(leaf_ready[hi - 1] + shift + d)
        shift += d
        shift_after.append(shift)
        work.append(b * m)
        lo = hi
    ev = _Eval()
    ev.his, ev.kinds = his, kinds
    ev.ready, ev.work, ev.shift_after = ready, work, shift_after
    ev.compute_end = model.layers.compute_s + (shift_after[-1] if shift_after else 0.0)
    ev.starts, ev.ends, ev.snaps = _wire(ready, work, kinds, link, base, from_g,
                                         sync if aligned else None, delta)
    ev.predicted = max(ev.compute_end, max(ev.ends)) if ev.ends else ev.compute_end
    return ev


def _wire(ready, work, kinds, link: Link, base: _Eval | None, from_g: int, sync: int | None,
          delta: int):
    """Event-driven simulation of the wire; ``work[g] = b * bytes`` (seconds of
    bytes alone on the link). Returns (starts, ends, snapshots). Snapshot ``g``
    is ``(t, active)`` right after group ``g`` started, each active operation as
    ``(g - its group, startup end, byte work left)`` (relative, so snapshots of
    equal suffixes compare equal)."""
    n_groups = len(ready)
    a, g1, cap = link.a, link.gamma - 1.0, link.max_concurrent
    share = link.link_b / link.b if link.link_b is not None and link.b > 0 else 0.0
    burst = link.burst_s
    # when the link last became idle (no operation in flight): the bucket holds the
    # idle time's bytes, at most burst. Full at the step's start; a resumed state (a
    # snapshot, taken right after a start) has an operation in flight, so it is set
    # again before it is read.
    idle_since = -math.inf
    if base is not None:
        starts = base.starts[:from_g] + [0.0] * (n_groups - from_g)
        ends = base.ends[:from_g] + [0.0] * (n_groups - from_g)
        snaps = base.snaps[:from_g] + [None] * (n_groups - from_g)
        t, frozen = base.snaps[from_g - 1]
        active = [[from_g - 1 - rel, su, rem] for rel, su, rem in frozen]
        k = from_g
    else:
        starts, ends, snaps = [0.0] * n_groups, [0.0] * n_groups, [None] * n_groups
        t, active, k = 0.0, [], 0
    while True:
        # Admit every group that may start now, in order.
        while k < n_groups and ready[k] <= t and (
                not active or (kinds[k] and k - active[0][0] < cap)):
            starts[k] = t
            w = work[k]
            if burst and not active:  # an idle link: the bucket's bytes go at once
                w -= min(burst, t - idle_since, w)
            active.append([k, t + a, w])  # [group, startup end, byte work left]
            snap = (t, tuple((k - op[0], op[1], op[2]) for op in active))
            snaps[k] = snap
            if sync is not None and k >= sync and snap == base.snaps[k + delta]:
                # Same state as the base from here on: the rest is the base's.
                for op in active:
                    ends[op[0]] = base.ends[op[0] + delta]
                starts[k + 1:] = base.starts[k + 1 + delta:]
                ends[k + 1:] = base.ends[k + 1 + delta:]
                snaps[k + 1:] = base.snaps[k + 1 + delta:]
                return starts, ends, snaps
            k += 1
        if not active:
            if k >= n_groups:
                break
            t = ready[k]
            continue
        nb = 0
        for op in active:
            if op[1] <= t:
                nb += 1
        s = 1.0 + g1 * (nb - 1) if nb > 1 else 1.0
        if share and nb > 1:  # the link's own bound (Link.link_b)
            s = max(s, nb * share)
        t_next = math.inf
        for op in active:
            e = op[1] if op[1] > t else t + op[2] * s
            if e < t_next:
                t_next = e
        if k < n_groups and kinds[k] and k - active[0][0] < cap and ready[k] < t_next:
            t_next = ready[k]
        dt = t_next - t
        still = []
        for op in active:
            if op[1] > t:  # in its startup (which ends at t_next at the latest)
                still.append(op)
            elif t + op[2] * s <= t_next:
                ends[op[0]] = t_next
            else:
                op[2] = max(0.0, op[2] - dt / s)
                still.append(op)
        active, t = still, t_next
        if not active:
            idle_since = t
    return starts, ends, snaps


def _to_internal(layers: LayerTimes, groups) -> tuple[list[int], list[int]]:
    his, kinds = [], []
    pos = 0
    try:
        items = list(groups)
    except TypeError:
        raise ValueError("groups must be a sequence of (leaves, kind) pairs") from None
    for i, item in enumerate(items):
        try:
            leaves, kind = item
            leaves = tuple(leaves)
        except (TypeError, ValueError):
            raise ValueError(f"groups[{i}] must be a (leaves, kind) pair; got {item!r}") from None
        if kind not in _KINDS:
            raise ValueError(f"groups[{i}] has kind {kind!r}; expected one of {_KINDS}")
        if not leaves:
            raise ValueError(f"groups[{i}] is empty")
        if leaves != layers.leaves[pos:pos + len(leaves)]:
            raise ValueError(f"groups must cover layers.leaves {layers.leaves} exactly once, in "
                             f"order, in consecutive runs; groups[{i}] = {leaves} does not "
                             f"continue at position {pos}")
        pos += len(leaves)
        his.append(pos)
        kinds.append(1 if kind == "simultaneous" and i else 0)
    if pos != len(layers.leaves):
        raise ValueError(f"groups cover only the first {pos} of the {len(layers.leaves)} leaves "
                         f"of layers.leaves")
    return his, kinds


def _to_plan(model: _Model, ev: _Eval, method: str) -> GroupingPlan:
    layers = model.layers
    groups, lo = [], 0
    for g, hi in enumerate(ev.his):
        n = model.prefix[hi] - model.prefix[lo]
        groups.append(Group(leaves=layers.leaves[lo:hi], kind=_KINDS[ev.kinds[g]], entries=n,
                            message_bytes=model.message_bytes(n), ready_s=ev.ready[g],
                            start_s=ev.starts[g], end_s=ev.ends[g],
                            names=layers.names[lo:hi] if layers.names else ()))
        lo = hi
    return GroupingPlan(method=method, groups=tuple(groups), compute_s=float(layers.compute_s),
                        predicted_s=ev.predicted, max_concurrent=model.link.max_concurrent)


def simulate(layers: LayerTimes, groups: Sequence[tuple[tuple[int, ...], str]], link: Link,
             message_bytes: Callable[[int], float],
             local_s: Callable[[int], float] = lambda n: 0.0,
             method: str = "custom") -> GroupingPlan:
    """Predicts the timeline of a grouping: the single source of every prediction.

    Args:
      layers: the leaves in backward order, their ready times and sizes.
      groups: ``(leaves, kind)`` pairs: consecutive runs of ``layers.leaves``
        covering each leaf once, in order; kind ``"normal"`` or
        ``"simultaneous"`` (the first group is normal whatever it says: nothing
        is in flight before it).
      link: the alpha-beta-gamma model.
      message_bytes: bytes on the wire of a group of ``n`` entries (for a
        sparse sync its compressed size).
      local_s: seconds of local work of a group of ``n`` entries (serial with
        the backward pass; it delays every later leaf).
      method: the name the plan carries.

    Returns:
      The :class:`GroupingPlan` with each group's predicted ready, start and end.

    Example:
      >>> from jax_sparse_sync.model import grouping as gp
      >>> layers = gp.LayerTimes(leaves=(1, 0), ready_s=(0.0, 0.0), entries=(1000, 1000),
      ...                        dense_bytes=(4000, 4000), compute_s=0.0)
      >>> p = gp.simulate(layers, [((1,), "normal"), ((0,), "simultaneous")],
      ...                 gp.Link(a=1e-3, b=1e-6, gamma=1.5), message_bytes=float)
      >>> [round(g.end_s * 1e3, 6) for g in p.groups]  # a + 1.5 b m each
      [2.5, 2.5]
    """
    model = _Model(layers, link, message_bytes, local_s)
    his, kinds = _to_internal(layers, groups)
    return _to_plan(model, _evaluate(model, his, kinds), method)


# ---------------------------------------------------------------------------
# The methods.


def _mg(model: _Model) -> _Eval:
    """MG-WFBP: merge leaf i into leaf i+1 while ``ready(i+1) < start(group of i) + a``."""
    n = len(model.ready)
    his, kinds = list(range(1, n + 1)), [0] * n
    ev = _evaluate(model, his, kinds)
    g = 0
    for i in range(n - 1):  # leaf i ends group g
        nxt = model.ready[i + 1] + ev.shift_after[g]
        if nxt < ev.starts[g] + model.link.a:
            his, kinds = his[:g] + his[g + 1:], kinds[:g] + kinds[g + 1:]
            ev = _evaluate(model, his, kinds, ev, g, g + 1)
        else:
            g += 1
    return ev


def _algorithm1(model: _Model) -> tuple[_Eval, list[str]]:
    """Algorithm 1 (DetermineLayerType) on the simulated timeline.

    Walks the leaves in backward order; leaf i ends group g of the current
    plan, which starts at tau_c and takes t_c; the next leaf is ready at
    ``nxt`` (the paper's tau_b^(l-1) + t_b^(l-1)):

    * Q1: ``tau_c + t_c <= nxt``: normal;
    * Q2: ``nxt < tau_c + a`` (the merge rule);
    * Q3: group g started at once (simultaneous, at its ready time r) with the
      penalty of eq. 13 from the group before it,
      ``(gamma - 1) b m_prev (1 - (r - tau_c_prev) / (a + b m_prev))``, still
      ends before ``nxt``;
    * ``not Q1 and Q2 and not Q3``: merged into the next leaf; otherwise
      simultaneous. (Q4 only splits the MG case in the paper's proof.)

    The plan is re-simulated after each change; the last leaf is simultaneous
    (the paper's ``s[1] = l_s``). Returns the evaluation and the leaf types.
    """
    link = model.link
    n = len(model.ready)
    types = ["normal"] * n
    his, kinds = list(range(1, n + 1)), [0] * n
    ev = _evaluate(model, his, kinds)
    g = 0
    for i in range(n - 1):
        tau_c, t_c = ev.starts[g], ev.ends[g] - ev.starts[g]
        nxt = model.ready[i + 1] + ev.shift_after[g]
        if tau_c + t_c <= nxt:  # Q1
            g += 1
            continue
        q2 = nxt < tau_c + link.a
        r = ev.ready[g]
        sc_start = r if g > 0 and link.max_concurrent > 1 else tau_c
        penalty = 0.0
        if g > 0 and ev.ends[g - 1] > sc_start:
            t_prev = link.a + ev.work[g - 1]
            done = (sc_start - ev.starts[g - 1]) / t_prev if t_prev > 0 else 1.0
            penalty = (link.slowdown(2) - 1.0) * ev.work[g - 1] * min(1.0, max(0.0, 1.0 - done))
        q3 = sc_start + link.a + ev.work[g] + penalty < nxt
        if q2 and not q3:
            types[i] = "merged"
            his, kinds = his[:g] + his[g + 1:], kinds[:g] + kinds[g + 1:]
            ev = _evaluate(model, his, kinds, ev, g, g + 1)
        elif g > 0:
            types[i] = "simultaneous"
            kinds = kinds[:g] + [1] + kinds[g + 1:]
            ev = _evaluate(model, his, kinds, ev, g, g + 1)
            g += 1
        else:  # the first group: nothing is in flight before it
            g += 1
    if n and g > 0:
        types[-1] = "simultaneous"
        kinds = kinds[:g] + [1]
        ev = _evaluate(model, his, kinds, ev, g, g + 1)
    return ev, types


def _best_normal(model: _Model) -> _Eval:
    """The fastest grouping whose groups are all normal, by dynamic programming
    over the end of the last group (exact without local work: with one group on
    the wire at a time the future depends only on when the link frees; with
    local work each prefix keeps the local work of its best path). O(L^2)."""
    link = model.link
    n = len(model.ready)
    end, shift, prev = [0.0] * (n + 1), [0.0] * (n + 1), [0] * (n + 1)
    for i in range(1, n + 1):
        best = None
        for j in range(i):
            m = model.prefix[i] - model.prefix[j]
            d = model.local(m)
            r = model.ready[i - 1] + shift[j] + d
            e = max(r, end[j]) + link.a + link.b * model.message_bytes(m)
            if best is None or (e, shift[j] + d) < best[:2]:
                best = (e, shift[j] + d, j)
        end[i], shift[i], prev[i] = best
    his, i = [], n
    while i > 0:
        his.append(i)
        i = prev[i]
    his.reverse()
    return _evaluate(model, his, [0] * len(his))


def _improve(model: _Model, ev: _Eval, passes: int = 2, max_cuts: int = 16) -> _Eval:
    """Greedy local search over the groups in order: flip a group's kind, merge
    it with the next group, or split it in two (at most ``max_cuts`` cut points
    spread over the group; the second part either kind), taking the best move
    whenever the simulator predicts the step strictly faster.

    At most ``4 L + 64`` simulations in all (each O(L) events), so the search
    is O(L^2) and deterministic: every rank computes the same plan."""
    budget = 4 * len(model.ready) + 64
    for _ in range(passes):
        improved = False
        g = 0
        while g < len(ev.his) and budget > 0:
            his, kinds = ev.his, ev.kinds
            cands = []  # (his, kinds, first group equal to the current plan's again)
            if g > 0:
                cands.append((his, kinds[:g] + [1 - kinds[g]] + kinds[g + 1:], g + 1))
            if g + 1 < len(his):
                merged = his[:g] + his[g + 1:]
                for kind in ((0, 1) if g > 0 else (0,)):
                    cands.append((merged, kinds[:g] + [kind] + kinds[g + 2:], g + 1))
            lo = his[g - 1] if g else 0
            size = his[g] - lo
            if size - 1 <= max_cuts:
                cuts = range(lo + 1, his[g])
            else:
                cuts = sorted({lo + 1 + (size - 2) * c // (max_cuts - 1) for c in range(max_cuts)})
            for cut in cuts:
                for kind in (0, 1):
                    cands.append((his[:g] + [cut] + his[g:],
                                  kinds[:g + 1] + [kind] + kinds[g + 1:], g + 2))
            best = ev
            for h, k, sync in cands[:budget]:
                budget -= 1
                e = _evaluate(model, h, k, ev, g, sync)
                if e.predicted < best.predicted:
                    best = e
            if best is ev:
                g += 1
            else:
                ev, improved = best, True
        if not improved:
            break
    return ev


def _canonical(model: _Model, ev: _Eval) -> _Eval:
    """Relabels normal every simultaneous group that found nothing else in flight
    when it started (the same timeline; fewer concurrent streams to run)."""
    kinds = [k if k == 0 or len(ev.snaps[g][1]) > 1 else 0 for g, k in enumerate(ev.kinds)]
    if kinds == ev.kinds:
        return ev
    e = _evaluate(model, ev.his, kinds)
    return e if e.predicted <= ev.predicted else ev


def plan(method: str, layers: LayerTimes, link: Link, message_bytes: Callable[[int], float],
         local_s: Callable[[int], float] = lambda n: 0.0,
         bucket_mb: float = 25.0, min_gain: float = 0.0) -> GroupingPlan:
    """Groups the leaves with ``method`` and predicts the step (via :func:`simulate`'s model).

    Methods (:data:`GROUPINGS`): ``none`` (one fused group), ``wfbp`` (one group
    per leaf), ``mg`` (MG-WFBP's merge rule, paper eq. 5, applied leaf by leaf on
    the re-simulated timeline), ``bucket`` (consecutive leaves in buckets of at
    most ``bucket_mb * 2**20`` dense bytes; a bigger leaf alone) and ``asc``.

    ``asc`` runs Algorithm 1 of the paper (Theorem 1, conditions Q1-Q4; see
    ``_algorithm1``) on the simulated timeline and returns its plan unless the
    simulator predicts another plan faster: the paper's optimality argument
    is pairwise and ignores startups overlapping other transfers,
    ``max_concurrent`` and local work (in this model a simultaneous pair often
    beats the merge Theorem 1 picks), so here it is a heuristic. The
    candidates are Algorithm 1's plan, the ``mg``, ``wfbp``, ``none`` and
    ``bucket`` plans and the best all-normal grouping (an O(L^2) dynamic
    program); the fastest (Algorithm 1's on a tie) then goes through a greedy
    pass that flips a group's kind, merges neighbours or splits a group while
    the simulator predicts a gain (a bounded number of simulations, so
    deterministic: every rank gets the same plan), and simultaneous groups
    that found nothing else in flight are relabelled normal (same timeline).
    The returned plan keeps method ``"asc"`` whichever candidate it came
    from, and with ``min_gain=0`` it is never predicted slower than the plan
    of any other method (``mg`` and ``wfbp`` in particular; ``bucket`` with
    the same ``bucket_mb``). Each method costs O(L^2) simulated events or
    less.

    **The ungrouped plan within the noise** (``asc`` only): a prediction is
    only as good as the timings it was made from, and a grouped plan costs more
    than the model sees when it is wrong (each group is a start, a done and a
    worker hand-off). So ``asc`` returns the one-group plan (the ungrouped
    sync) whenever the plan found above is predicted faster than it by at most
    ``min_gain`` of its time: ``t_one - t <= min_gain * t_one``; otherwise the
    plan found above. Only the one-group plan is preferred this way, not any
    plan of fewer groups (fewer groups are not safer by themselves: a plan of
    fewer groups within the noise can run slower than the fastest plan). With
    ``min_gain > 0`` the plan is never predicted slower
    than any other method's by more than ``min_gain`` of its time.
    ``jss.planning.plan_grouping`` passes the noise of the timings the plan is
    made from (see its ``min_gain``); here the default 0 keeps the fastest.

    Args:
      method: one of :data:`GROUPINGS`.
      layers: the leaves in backward order (ready times, sizes).
      link: the alpha-beta-gamma model (its ``max_concurrent`` bounds ``asc``).
      message_bytes: bytes on the wire of a group of ``n`` entries (for a sparse
        sync its compressed size).
      local_s: seconds of local work of a group of ``n`` entries.
      bucket_mb: the bucket size of ``bucket``, in MiB of dense bytes.
      min_gain: ``asc`` only: the predicted gain over the one-group plan (a
        fraction of its predicted time, ``0 <= min_gain < 1``) a grouped plan
        must exceed to be chosen (see above). 0: the fastest.

    Returns:
      The :class:`GroupingPlan`.

    Raises:
      ValueError: unknown method, non-positive ``bucket_mb``, ``min_gain``
        outside ``[0, 1)``, bad layers or link.

    Example:
      >>> from jax_sparse_sync.model import grouping as gp
      >>> layers = gp.LayerTimes(leaves=(2, 1, 0), ready_s=(0.0, 0.0005, 0.0005),
      ...                        entries=(10, 10, 10), dense_bytes=(40, 40, 40),
      ...                        compute_s=0.001)
      >>> link = gp.Link(a=1e-3, b=1e-6, gamma=1.5, max_concurrent=1)
      >>> gp.plan("mg", layers, link, message_bytes=lambda n: 8.0 * n).leaf_groups()
      ((2, 1, 0),)
      >>> len(gp.plan("wfbp", layers, link, message_bytes=lambda n: 8.0 * n).groups)
      3
    """
    if method not in GROUPINGS:
        raise ValueError(f"unknown grouping method {method!r}; expected one of {GROUPINGS}")
    if method in ("bucket", "asc") and not (_finite(bucket_mb) and bucket_mb > 0):
        raise ValueError(f"bucket_mb must be a finite number > 0; got {bucket_mb!r}")
    check_min_gain(min_gain)
    model = _Model(layers, link, message_bytes, local_s)
    if method != "asc":
        return _to_plan(model, _baseline(model, method, bucket_mb), method)
    alg1, _ = _algorithm1(model)
    # Every seed simulated fresh (the same code path as plan(<method>)).
    seeds = [_evaluate(model, alg1.his, alg1.kinds)]
    seeds += [_baseline(model, m, bucket_mb) for m in ("mg", "wfbp", "none", "bucket")]
    seeds.append(_best_normal(model))
    ev = seeds[0]
    for other in seeds[1:]:
        if other.predicted < ev.predicted:
            ev = other
    ev = _canonical(model, _improve(model, ev))
    ev = _evaluate(model, ev.his, ev.kinds)
    for other in seeds:  # the guard: never predicted slower than a seed
        if other.predicted < ev.predicted:
            ev = other
    if min_gain > 0:
        ev = _ungrouped_within(ev, _baseline(model, "none", bucket_mb), min_gain)
    return _to_plan(model, ev, method)


def check_min_gain(min_gain, op: str = "grouping.plan", *, default: bool = False) -> float:
    """``min_gain`` as a float, or a ValueError naming ``op`` (the function that
    received it), the argument and the fix (finite, ``0 <= min_gain < 1``;
    ``default``: ``op`` also takes None, its default margin)."""
    if not (_finite(min_gain) and 0 <= min_gain < 1):
        raise ValueError(f"{op}: min_gain must be a fraction of the step, a finite number in "
                         f"[0, 1); got {min_gain!r}. Pass e.g. min_gain=0.05 (a grouped plan "
                         f"must be predicted 5 % faster than one group) or 0 (the fastest "
                         f"predicted plan)"
                         + (", or None (the default margin: the profile's measured timing "
                            "spread, at least 5 %)" if default else ""))
    return float(min_gain)


def _ungrouped_within(ev: _Eval, one: _Eval, min_gain: float) -> _Eval:
    """The one-group plan ``one`` where ``ev``'s predicted gain over it is at most
    ``min_gain`` of its time (:func:`plan`), else ``ev``."""
    return one if one.predicted - ev.predicted <= min_gain * one.predicted else ev


def _baseline(model: _Model, method: str, bucket_mb: float) -> _Eval:
    """The plan of ``method`` (not ``asc``), simulated fresh."""
    layers = model.layers
    n = len(layers.leaves)
    if method == "none":
        his = [n] if n else []
    elif method == "wfbp":
        his = list(range(1, n + 1))
    elif method == "bucket":
        cap = bucket_mb * 2 ** 20
        his, size = [], 0
        for i, d in enumerate(layers.dense_bytes):
            if size > 0 and size + d > cap:
                his.append(i)
                size = 0
            size += d
        if n:
            his.append(n)
    else:
        his = _mg(model).his
    return _evaluate(model, his, [0] * len(his))
