"""When each gradient leaf exists during the backward pass: the planner's input.

How it is measured, and why this way. XLA fuses and reorders the whole step,
so there is no per-layer timer to read inside one jitted step; a host callback
per leaf would change the schedule it measures. Instead, for each probe (a
leaf, or all the leaves of one module) we jit the gradient of the loss with
respect to everything but keep only that probe's leaves as the output: XLA's
dead-code elimination then drops every part of the backward pass that this
gradient does not depend on, and the step's time is the time at which that
gradient would exist in the full step (forward + the backward up to it). The
probes' times, sorted, are the ready times; differences between consecutive
ones are the per-layer backward times. This works for any model whose loss is
a function of a parameter pytree (Flax linen ``apply``, an NNX model through
``nnx.split`` / ``nnx.merge``, plain JAX), on every backend, and measures the
compiled code that the training step runs.

A single probe omits the weight-gradient work of the leaves that become ready
before it (it is not on the probe's path), so it reads early in the full step.
``cumulative=`` adds probes of the gradient of *all* leaves
ready up to a point (cuts spread over the backward order, the last one being
the whole gradient): at a cut, the difference to the single probe is the
omitted work W, and every probe's ready time becomes its single time plus W
interpolated between the cuts (:func:`cumulative_ready`).

Times are medians over ``repeats`` runs; with ``comm`` given every rank
measures at the same time (so ranks sharing a host contend as in training) and
all take the per-probe median over ranks: the profile, and so every plan made
from it, is the same on every rank.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from jax_sparse_sync.planning.timing import relative_deviations, timed_samples

__all__ = ["BackwardProfile", "profile_backward", "leaf_names", "cumulative_ready"]


def leaf_names(tree) -> tuple[str, ...]:
    """``jax.tree_util`` paths of the leaves, as ``"Dense_0/kernel"``."""
    def name(path):
        parts = []
        for p in path:
            key = getattr(p, "key", getattr(p, "name", getattr(p, "idx", p)))
            parts.append(str(key))
        return "/".join(parts)
    return tuple(name(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0])


@dataclasses.dataclass(frozen=True)
class BackwardProfile:
    """Per-leaf gradient ready times of one training step (leaves in tree order).

    Attributes:
      names: leaf paths.
      entries: entries of each leaf.
      dense_bytes: bytes of each leaf's gradient.
      ready_s: seconds from the step's start until the leaf's gradient exists.
      compute_s: seconds of the whole gradient (forward + backward).
      order: leaf indices in the order their gradients become ready (backward order).
      timing_spread: the noise of the timings the profile was made from, as a
        fraction: the deviations of every probe's repeated times from that
        probe's median, relative to it (without the median repeat of an odd
        count), pooled over the probes; their median (for symmetric noise the
        half-IQR of the timings, and robust to a stalled repeat), the largest
        over the ranks; ``None`` when not measured (a profile written by hand or
        saved before it was recorded). ``jss.planning.plan_grouping`` takes it as
        the planner's ``min_gain`` (at least its 5 % default): a gain the
        timings cannot resolve is not worth grouping.
    """

    names: tuple[str, ...]
    entries: tuple[int, ...]
    dense_bytes: tuple[int, ...]
    ready_s: tuple[float, ...]
    compute_s: float
    order: tuple[int, ...]
    timing_spread: float | None = None

    def backward_s(self) -> tuple[float, ...]:
        """Backward time attributed to each leaf (tree order): its ready time minus
        the previous leaf's in backward order (the first one: minus 0, so it
        includes the forward pass)."""
        out = [0.0] * len(self.names)
        prev = 0.0
        for i in self.order:
            out[i] = max(0.0, self.ready_s[i] - prev)
            prev = max(prev, self.ready_s[i])
        return tuple(out)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "BackwardProfile":
        return cls(names=tuple(d["names"]), entries=tuple(int(x) for x in d["entries"]),
                   dense_bytes=tuple(int(x) for x in d["dense_bytes"]),
                   ready_s=tuple(float(x) for x in d["ready_s"]),
                   compute_s=float(d["compute_s"]), order=tuple(int(x) for x in d["order"]),
                   timing_spread=(None if d.get("timing_spread") is None
                                  else float(d["timing_spread"])))

    def table(self) -> str:
        """A readable table in backward order."""
        bw = self.backward_s()
        lines = [f"{'#':>3}  {'leaf':<40} {'entries':>10} {'ready ms':>9} {'bwd ms':>8}"]
        for n, i in enumerate(self.order):
            lines.append(f"{n:>3}  {self.names[i][:40]:<40} {self.entries[i]:>10} "
                         f"{self.ready_s[i] * 1e3:>9.2f} {bw[i] * 1e3:>8.2f}")
        lines.append(f"whole gradient: {self.compute_s * 1e3:.2f} ms")
        return "\n".join(lines)


def _median_time(fn, args, repeats: int, comm, spreads: list | None = None) -> float:
    """The median of ``repeats`` timed runs; their relative spread appended to ``spreads``."""
    samples = timed_samples(lambda: jax.block_until_ready(fn(*args)), repeats=repeats, comm=comm)
    if spreads is not None:
        spreads.extend(relative_deviations(samples))
    return float(np.median(samples))


def cut_positions(num_probes: int, cuts: int) -> list[int]:
    """Positions (in backward order, 0-based) of the cumulative probes: ``cuts``
    of them spread evenly, the last probe always included."""
    cuts = max(1, min(cuts, num_probes))
    return sorted({round((c + 1) * num_probes / cuts) - 1 for c in range(cuts)})


def cumulative_ready(single, cuts, cut_times) -> list[float]:
    """Ready times in backward order from single and cumulative probe times.

    Args:
      single: each probe's own time, in backward order (ascending).
      cuts: positions of the cumulative probes (ascending, the last probe
        last; see :func:`cut_positions`).
      cut_times: the time of the gradient of probes ``0..cut`` for each cut.

    Returns:
      ``single[r] + W(r)``, W the omitted weight-gradient work: ``cut_time -
      single[cut]`` at a cut (at least 0), 0 before the first probe, linear in
      between; never later than the next cut's time (nothing is ready after
      the gradient that contains it), and made non-decreasing.

    Example:
      >>> cumulative_ready([1.0, 2.0, 3.0, 4.0], [1, 3], [2.5, 6.0])
      [1.25, 2.5, 4.25, 6.0]
    """
    points = [(-1, 0.0, float("inf"))] + [
        (c, max(0.0, t - single[c]), t) for c, t in zip(cuts, cut_times)]
    out, prev, seg = [], 0.0, 0
    for r, t in enumerate(single):
        while seg + 1 < len(points) - 1 and points[seg + 1][0] < r:
            seg += 1
        (r0, w0, _), (r1, w1, cap) = points[seg], points[min(seg + 1, len(points) - 1)]
        if r > r1:  # past the last cut (not with cut_positions): no cap
            wr, cap = w1, float("inf")
        else:
            wr = w0 + (w1 - w0) * (r - r0) / (r1 - r0)
        prev = max(prev, min(t + wr, max(cap, t)))
        out.append(prev)
    return out


def _agree(times, comm):
    """The per-entry median over ranks (the same array on every rank)."""
    if comm is not None and comm.Get_size() > 1:
        return np.median(np.array(comm.allgather(np.asarray(times))), axis=0)
    return times


def _probes(names, by: str) -> list[list[int]]:
    if by == "leaf":
        return [[i] for i in range(len(names))]
    groups: dict[str, list[int]] = {}
    for i, n in enumerate(names):
        groups.setdefault(n.rsplit("/", 1)[0] if "/" in n else n, []).append(i)
    return list(groups.values())


def profile_backward(loss_fn, params, *batch, repeats: int = 5, by: str = "module",
                     comm=None, cumulative: int = 8) -> BackwardProfile:
    """Measures when each gradient leaf of ``jax.grad(loss_fn)`` becomes ready.

    Args:
      loss_fn: ``loss_fn(params, *batch) -> scalar``.
      params: the parameter pytree (its leaves are the gradient's leaves).
      *batch: a representative batch (the shapes of training).
      repeats: timed runs per probe (median).
      by: ``"module"``: one probe per parent path (a layer's kernel and bias
        share one; fewer compilations); ``"leaf"``: one per leaf.
      comm: an mpi4py communicator: every rank measures at once and all agree
        on the per-probe median over ranks (call it on every rank). ``None``:
        this process alone.
      cumulative: number of cumulative probes that correct the single probes
        for the weight-gradient work they omit (see the module doc); 0: off
        (single probes only, early ready times).

    Returns:
      A :class:`BackwardProfile`.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from jax_sparse_sync.planning.profile import profile_backward
      >>> params = {"a": {"w": jnp.ones((64, 64))}, "b": {"w": jnp.ones((64, 8))}}
      >>> loss = lambda p, x: jnp.sum(jnp.tanh(x @ p["a"]["w"]) @ p["b"]["w"])
      >>> prof = profile_backward(loss, params, jnp.ones((16, 64)), repeats=2)
      >>> prof.names, prof.entries
      (('a/w', 'b/w'), (4096, 512))
      >>> max(prof.ready_s) <= prof.compute_s
      True

      ``prof.order`` is the backward order (``b/w`` first, on a quiet machine:
      these two probes are microseconds apart).
    """
    if by not in ("module", "leaf"):
        raise ValueError(f"profile_backward: `by` must be 'module' or 'leaf'; got {by!r}")
    if isinstance(cumulative, bool) or not isinstance(cumulative, int) or cumulative < 0:
        raise ValueError(f"profile_backward: `cumulative` must be an int >= 0 (0: off); "
                         f"got {cumulative!r}")
    leaves, treedef = jax.tree_util.tree_flatten(params)
    names = leaf_names(params)
    grad = jax.grad(loss_fn)

    def only(ids):
        def f(p, *b):
            g = jax.tree_util.tree_leaves(grad(p, *b))
            return [g[i] for i in ids]
        return jax.jit(f)

    probes = _probes(names, by)
    spreads: list = []
    times = np.array([_median_time(only(ids), (params, *batch), repeats, comm, spreads)
                      for ids in probes]
                     + [_median_time(jax.jit(grad), (params, *batch), repeats, comm, spreads)])
    times = _agree(times, comm)
    ready = [0.0] * len(leaves)
    # backward order of the probes; ties keep tree order (the same on every rank)
    by_time = sorted(range(len(probes)), key=lambda j: (times[j], probes[j][0]))
    single = [float(times[j]) for j in by_time]
    if cumulative and len(probes) > 1:
        cuts = cut_positions(len(probes), cumulative)
        # the last cut is the whole gradient, timed above
        cut_times = [_median_time(only(sorted(i for j in by_time[:c + 1] for i in probes[j])),
                                  (params, *batch), repeats, comm, spreads)
                     for c in cuts[:-1]]
        cut_times = list(_agree(np.array(cut_times), comm)) + [float(times[-1])]
        single = cumulative_ready(single, cuts, cut_times)
    for j, t in zip(by_time, single):
        for i in probes[j]:
            ready[i] = float(t)
    compute = float(max(times[-1], max(ready)))
    # The probes' backward order (a module's leaves in tree order): the same on every
    # rank because the times are. Not re-sorted by the corrected times, whose ties
    # (made non-decreasing) carry no order.
    order = tuple(i for j in by_time for i in sorted(probes[j]))
    spread = float(np.median(spreads)) if spreads else None
    if spread is not None and comm is not None and comm.Get_size() > 1:
        spread = float(max(comm.allgather(spread)))  # the noisiest rank's: the same on all
    return BackwardProfile(
        names=names,
        entries=tuple(int(np.size(x)) for x in leaves),
        dense_bytes=tuple(int(np.size(x)) * np.dtype(x.dtype).itemsize for x in leaves),
        ready_s=tuple(ready), compute_s=compute, order=order, timing_spread=spread)
