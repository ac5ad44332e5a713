"""``shared_support_sync``: index-free Top-k, the values summed by one dense allreduce of k floats.

When every rank sends its values on the same k coordinates, the sum needs no
indices and no sparse merge: a plain dense allreduce of k floats (one
``MPI_Allreduce``, or a ``psum`` over a mesh axis), the collective that
NCCL-only stacks offer ("allreduce-compatible" Top-k, as in ARC-Top-K,
arXiv 2510.26709). The ranks agree on the coordinates without sending any:
every ``refresh_every`` steps one step runs ``topk_sync(selection="exact")``'s
exchange (each rank's exact local top-k through the sparse allreduce), and
the k largest magnitudes of that step's sum, which is bitwise identical on
every rank, become the support every rank uses until the next refresh. Error
feedback keeps everything off the support in each rank's residual until a
refresh step selects it.

Every step accumulates in place, outside the ``lax.cond`` that picks the
step's exchange (a write inside a branch makes XLA copy the N-entry residual).
The refresh step costs what a ``topk_sync`` step costs plus two reads of N
entries: its local top-k is taken from the accumulator's entries above 0.95 of
a hint (the last refresh's k-th magnitude, kept in the state), listed in one
pass, as ``topk_sync``'s fused accumulate-and-select does while it
accumulates; and the support is chosen among the sum's nonzeros (at most P k),
listed in one pass (:func:`support_of_sum`), not by a top-k over all N entries.

With ``random_fraction=f`` the support moves between refreshes without index
traffic: a refresh keeps the ``k - round(f k)`` largest magnitudes of its sum,
and every other step adds ``round(f k)`` coordinates drawn from a PRNG keyed by
a shared seed and the step count (the same on every rank without a message;
ARC-Top-K, arXiv 2510.26709, combines Top-k's structure with Rand-k's coverage
in the same way). Error feedback keeps what neither part sends.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from jax_sparse_sync.base.jax_compat import varying_axes, varying_like
from jax_sparse_sync.base.transform_arguments import check_float_leaves
from jax_sparse_sync.bindings.selection import topk
from jax_sparse_sync.ops import transport
from jax_sparse_sync.stats import STATS_FIELDS, stats_dtype
from jax_sparse_sync.transforms.accumulator_source import gradient_source
from jax_sparse_sync.transforms.cyclic_selection import dense_sum
from jax_sparse_sync.transforms.flat import flat_residual, flat_size, split_like
from jax_sparse_sync.transforms.phases import accumulate, init_size, settle
from jax_sparse_sync.transforms.selection_policy import hinted_topk, kth_magnitude_of
from jax_sparse_sync.transforms.shared_support_config import SharedSupportConfig
from jax_sparse_sync.transforms.shared_support_selection import (nth_outside, random_offsets,
                                                                 support_of_sum)
from jax_sparse_sync.transforms.topk_selection import ExchangeArguments, sparse_exchange
from jax_sparse_sync.transforms.world import check_world, world_marker

__all__ = ["SharedSupportSyncState", "shared_support_sync", "support_of_sum", "random_offsets",
           "nth_outside"]

OP = "shared_support_sync"

#: accumulator dtypes the selection kernels and ``residual_update`` take as they are
SELECTABLE = (jnp.float32, jnp.bfloat16, jnp.float16)


class SharedSupportSyncState(NamedTuple):
    """State of :func:`shared_support_sync`: arrays only, so it checkpoints with the optimizer.

    Attributes:
      count: number of steps taken (int32).
      residual: what this rank has accumulated but not yet sent: one flat
        vector of all N entries in ``residual_dtype`` (the layout of
        ``TopkSyncState.residual``; ``jss.unflatten_residual`` gives it the
        parameters' shapes). It differs from rank to rank: checkpoint it per rank.
      support: the ``k - round(random_fraction * k)`` coordinates (int32,
        ascending) that every non-refresh step sums: the largest magnitudes of
        the last refresh step's sum (all k of them with ``random_fraction=0``).
        The same on every rank.
      threshold: this rank's k-th magnitude of the last refresh step's
        accumulator (float32; ``TopkSyncState.threshold``'s meaning for the
        exact selection): the refresh step's hint, as in ``topk_sync``'s fused
        accumulate-and-select: the entries above 0.95 of it are listed and the
        top k taken from that short list
        (``jax_sparse_sync.transforms.selection_policy.hinted_topk``).
        Per rank; 0 at ``init`` (the first step lists every nonzero); kept as
        it is with a residual other than float32.
      last_stats: this rank's wire statistics of the last step (see
        ``TopkSyncState.last_stats``; ``jss.SyncStats.from_vector`` reads it).
      world: the communicator that wrote the state (see ``TopkSyncState.world``):
        a step at another world size raises, naming :func:`jss.reshard_state`.
    """

    count: jax.Array
    residual: jax.Array
    support: jax.Array
    threshold: jax.Array
    last_stats: jax.Array
    world: jax.Array | None = None


def shared_support_sync(
    *,
    density: float | None = None,
    k: int | None = None,
    refresh_every: int = 2,
    random_fraction: float = 0.0,
    seed: int = 0,
    algorithm: str = "auto",
    comm=None,
    residual_dtype=jnp.float32,
    nan_policy: str = "raise",
) -> optax.GradientTransformation:
    """Index-free error-feedback Top-k: a dense allreduce of k values on a shared support.

    Each step, on every rank: ``acc = residual + grad`` (all leaves flattened
    and concatenated in ``jax.tree_util`` order), then

    * on a refresh step (``count % refresh_every == 0``, the first step
      included): ``topk_sync(selection="exact")``'s step: this rank's exact
      top-k of ``|acc|`` summed over the ranks by ``algorithm``'s sparse
      allreduce, the update that sum divided by P, the residual ``acc`` zeroed
      at the local selection. The k largest magnitudes of the sum (ties to the
      lower index, and zeros by lowest index when it has fewer than k nonzeros:
      ``jss.topk(sum, k)``'s choice, taken from the sum's at most P k nonzeros
      by :func:`support_of_sum`; the sum is bitwise identical on every rank, so
      is this choice) become the support;
    * on every other step: ``acc[support]`` (k floats) summed over the ranks
      by one :func:`jss.dense_allreduce` (``MPI_Allreduce`` or ``psum``): no
      indices travel and nothing is merged; the update is that sum divided by
      P at the support, zero elsewhere; the residual is ``acc`` zeroed at the
      support (every rank sends, and empties, the same k coordinates).

    With ``random_fraction=f > 0`` the support keeps only the
    ``k_fixed = k - round(f k)`` largest magnitudes of the refresh step's sum,
    and each other step sends ``k_fixed`` + ``round(f k)`` coordinates: the
    support and as many drawn at random from the others, by a PRNG keyed by
    ``seed`` and the step count (identical on every rank with no message): the
    N - k_fixed coordinates off the support are cut into ``round(f k)`` equal
    strata (of sizes differing by at most one) and one is drawn uniformly from
    each (:func:`random_offsets`, :func:`nth_outside`), so each coordinate has
    a chance of one over its stratum's size a step (about ``round(f k) / (N -
    k_fixed)``) and no two draws fall together. ``round`` is Python's (halves
    to even: k = 5, f = 0.5 draws 2). Still one dense
    allreduce of k floats; the residual is zeroed at all k.

    The update is cut into the gradient's tree and dtypes; every rank ends
    the step with the same update bit for bit. Between refreshes the same k
    coordinates move; the others wait in the residuals for the next refresh
    step, whose local top-k picks them up (``refresh_every=1`` is
    ``topk_sync(selection="exact")`` step for step).

    On the wire a non-refresh step sends what a dense allreduce of k floats
    sends (the statistics count Rabenseifner's ``2 (P-1)/P * 4k`` bytes plus
    the 56-byte header check every collective of the library begins with),
    against ``topk_sync``'s k (index, value) pairs from every rank (the
    allgather receives ``8 (P-1) k`` bytes). A refresh step costs what a
    ``topk_sync`` step costs plus two reads of N entries: with a float32
    residual its local top-k is taken from the accumulator's entries above
    0.95 of a hint (the last refresh's k-th magnitude, kept in the state),
    listed in one pass; and the N-entry sum's nonzeros are listed in another.
    Every step accumulates in place outside the branches, so the shared steps
    accumulate and gather k values, with no copy of the residual.

    It trains behind ``topk_sync`` at the same density, the more so the
    rarer the refreshes: over a refresh period the run moves about k
    coordinates, and what waits off the support arrives at the refresh as
    one stale burst. Measurements: docs/topics/shared_support.md.

    Under ``jax.shard_map`` pass ``check_vma=False`` (with ``check_vma=True``
    the support, read from the per-device state, types as varying, and so
    would the update; the step raises saying so).

    Args:
      density: fraction of entries kept per step, in (0, 1]. Exclusive with ``k``.
      k: number of entries kept per step, in [1, N].
      refresh_every: steps between support refreshes (an int >= 1): steps
        0, ``refresh_every``, ``2 refresh_every``, ... run the sparse exchange.
      random_fraction: the fraction of the k coordinates a non-refresh step
        draws at random instead of taking from the last refresh (a float in
        [0, 1]; ``round(random_fraction * k)`` of them). 0 (default): the
        fixed support; 1: Rand-k with a shared seed between refreshes. Needs
        ``refresh_every >= 2`` (with 1 every step refreshes).
      seed: the draws' seed (an int, the same on every rank).
      algorithm: the refresh steps' sparse allreduce algorithm (see
        :func:`jss.sparse_allreduce`); ``"auto"`` picks by the cost model.
      comm: mpi4py communicator (``None``: the library's clone of
        COMM_WORLD), or ``jss.axis(name)`` inside shard_map/pmap.
      residual_dtype: dtype the residual accumulates in (float32 by default).
      nan_policy: ``"raise"``: a NaN/Inf in any rank's sent values makes every
        rank raise (the step is not applied); a non-finite entry off the
        support stays in the residual until the next refresh step, whose
        top-k always selects it; ``"propagate"``: summed like any other value.

    Returns:
      An ``optax.GradientTransformation`` whose state is a
      :class:`SharedSupportSyncState`. Donate it in the jitted step, as for
      :func:`jss.topk_sync`.

    Example:
      >>> import jax.numpy as jnp, optax, jax_sparse_sync as jss
      >>> tx = jss.shared_support_sync(k=1, refresh_every=4)
      >>> state = tx.init({"w": jnp.zeros(3)})
      >>> u, state = tx.update({"w": jnp.array([1., -5., 2.])}, state)  # refresh: support {1}
      >>> u["w"].tolist(), state.support.tolist()
      ([0.0, -5.0, 0.0], [1])
      >>> u, state = tx.update({"w": jnp.array([1., 1., 1.])}, state)  # entry 1 again
      >>> u["w"].tolist(), state.residual.tolist()
      ([0.0, 1.0, 0.0], [2.0, 0.0, 3.0])
    """
    config = SharedSupportConfig.build(
        density=density, k=k, refresh_every=refresh_every, random_fraction=random_fraction,
        seed=seed, algorithm=algorithm, comm=comm, residual_dtype=residual_dtype,
        nan_policy=nan_policy)
    source = gradient_source(config.shared.residual_dtype)

    def init_fn(params):
        return init_state(config, params)

    def update_fn(updates, state, params=None):
        del params
        return step(config, source, updates, state)

    return optax.GradientTransformation(init_fn, update_fn)


def init_state(config: SharedSupportConfig, params) -> SharedSupportSyncState:
    """The state of a run on ``params``: zeros, and a placeholder support (the first
    step refreshes it). With ``random_fraction`` over MPI, the seeds checked equal."""
    size = init_size(config.shared, params)
    _, k_fixed = config.kept(size)
    if config.random_fraction and not config.shared.on_mesh_axis:
        check_same_seed(config)
    return SharedSupportSyncState(
        count=jnp.zeros((), jnp.int32),
        residual=jnp.zeros((size,), config.shared.residual_dtype),
        support=jnp.arange(k_fixed, dtype=jnp.int32),  # replaced by the first (refresh) step
        threshold=jnp.zeros((), jnp.float32),
        last_stats=jnp.zeros((len(STATS_FIELDS),), stats_dtype()),
        world=world_marker(config.shared.comm))


def check_same_seed(config: SharedSupportConfig) -> None:
    """The draws must be the same on every rank; a per-rank seed (seed=rank) would
    send values from different coordinates, summed as if they were the same."""
    seeds = config.shared.comm.allgather(int(config.seed))
    if len(set(seeds)) > 1:
        raise ValueError(f"jax_sparse_sync.{OP}: `seed` must be the same on every rank "
                         f"(the random part of the support is drawn from it without a "
                         f"message); the ranks passed {seeds}")


def step(config: SharedSupportConfig, source, updates, state: SharedSupportSyncState):
    """One step: begin -> accumulate -> select and exchange -> settle."""
    residual, kk = begin(config, updates, state)
    # The accumulate pass (acc = residual + grad, in the residual's buffer) before
    # the exchange's branches and the residual update after them, both in place:
    # inside a branch of the cond, XLA copies every N-entry buffer written in place.
    acc, local = accumulate_step(config, source, residual, updates, state, kk)
    exchanged = exchange(config, acc, local, state, kk)
    return finish(config, acc, exchanged, updates, state)


def begin(config: SharedSupportConfig, updates, state: SharedSupportSyncState):
    """Phase 1: ``(flat residual, k)``; the gradient and the state checked against
    this step (float leaves, the world size, the support's length, its typing)."""
    shared = config.shared
    check_float_leaves(updates, "gradient", OP)
    check_world(state.world, shared.comm, OP)
    size = flat_size(updates)
    kk, k_fixed = config.kept(size)
    residual = flat_residual(state.residual, size, shared.residual_dtype, OP)
    if tuple(jnp.shape(state.support)) != (k_fixed,):
        raise ValueError(f"jax_sparse_sync.{OP}: the state's support holds "
                         f"{jnp.shape(state.support)} entries but this step keeps "
                         f"{k_fixed} (k={kk}, random_fraction={config.random_fraction}); was "
                         "the state initialised for other parameters, another k or another "
                         "random_fraction?")
    if config.refresh_every > 1 and shared.on_mesh_axis \
            and shared.comm.name in varying_axes(state.support):
        # the update would be scattered at per-device positions: shard_map types
        # it varying, and only a collective (index traffic) could type it replicated
        raise ValueError(
            f"jax_sparse_sync.{OP}: under shard_map with check_vma=True the support "
            f"read from the per-device state is typed as varying over {shared.comm.name!r}, "
            "and so would the update be; pass check_vma=False to jax.shard_map (the "
            "support is the same on every device by construction), or use "
            "refresh_every=1")
    return residual, kk


def accumulate_step(config: SharedSupportConfig, source, residual, updates, state, kk):
    """Phase 2: ``(acc, the local exact top-k (values, indices), or None: the refresh
    step's to select)``."""
    if config.hinted and config.refresh_every == 1:
        # every step refreshes (no cond): topk_sync's fused accumulate-and-select
        produced = accumulate(config.shared, source, residual, updates, state.count, k=kk,
                              last_kth=state.threshold)
        return produced.acc, (produced.values, produced.indices)
    # the plain in-place accumulate on every step, outside the cond (within a
    # branch XLA copied the residual before writing it: one f32[N] copy a step);
    # the refresh branch selects from acc
    return accumulate(config.shared, source, residual, updates, state.count).acc, None


def exchange(config: SharedSupportConfig, acc, local, state, kk):
    """Phase 3: the step's exchange, the refresh's or the shared one's: ``(summed,
    sent, support, threshold, stats)``."""
    sel = acc if acc.dtype in SELECTABLE else acc.astype(jnp.float32)
    refresh = functools.partial(refresh_exchange, config, local)
    if config.refresh_every == 1:
        return refresh(sel, state, kk)
    shared = functools.partial(shared_exchange, config)
    return jax.lax.cond(state.count % config.refresh_every == 0, typed(refresh, kk, sel),
                        typed(shared, kk, sel), sel, state)


def local_top_k(config: SharedSupportConfig, sel, state, kk):
    """A refresh step's exact local top-k of the accumulator, and the next hint."""
    if not config.hinted:
        return topk(sel, kk), state.threshold
    values, indices = hinted_topk(sel, kk, state.threshold)
    return (values, indices), kth_magnitude_of(values)


def refresh_exchange(config: SharedSupportConfig, local, sel, state, kk):
    """A refresh step: ``topk_sync(selection="exact")``'s exchange (the local exact
    top-k, the sparse allreduce), and the support chosen from the sum."""
    shared = config.shared
    if local is None:
        (values, indices), threshold = local_top_k(config, sel, state, kk)
    else:
        (values, indices), threshold = local, kth_magnitude_of(local[0])
    summed, indices, stats = sparse_exchange(sel, values, indices, ExchangeArguments(
        size=sel.shape[0], k=kk, step=state.count, comm=shared.comm, algorithm=config.algorithm,
        nan_policy=shared.nan_policy, quantize_bits=0, qsgd_bucket=1024))
    # the same bits on every rank, the same ties to the lower index: the same
    # support; the sum has at most P k nonzeros (the ranks' selections)
    nonzeros = min(sel.shape[0], transport.comm_size_in_trace(shared.comm) * kk)
    k_fixed = state.support.shape[0]
    return summed, indices, support_of_sum(summed, k_fixed, nonzeros), threshold, stats


def shared_exchange(config: SharedSupportConfig, sel, state, kk):
    """A shared step: the accumulator at the support (and the coordinates drawn off
    it) summed by one dense allreduce of k floats."""
    support = state.support
    sent = support
    if kk > support.shape[0]:  # and as many drawn off the support (all distinct)
        n, drawn = sel.shape[0], kk - support.shape[0]
        offsets = random_offsets(config.seed, state.count, n - support.shape[0], drawn)
        sent = jnp.concatenate([support, nth_outside(support, offsets)])
    values, stats = dense_sum(sel[sent].astype(jnp.float32), config.shared.comm,
                              config.shared.nan_policy)
    summed = jnp.zeros((sel.shape[0],), jnp.float32).at[sent].set(
        values, unique_indices=True)
    return summed, sent, support, state.threshold, stats  # no selection: the hint stays


def finish(config: SharedSupportConfig, acc, exchanged, updates, state):
    """Phase 4: the update (the sum over P, cut into the gradient's tree) and the
    state (the sent entries zeroed in the residual, in place; the count advanced)."""
    summed, sent, support, threshold, stats = exchanged
    new_updates = split_like(summed, updates,
                             scale=transport.comm_size_in_trace(config.shared.comm))
    return new_updates, SharedSupportSyncState(
        count=optax.safe_increment(state.count), residual=settle(acc, sent, None),
        support=support.astype(jnp.int32), threshold=threshold,
        last_stats=stats.astype(state.last_stats.dtype), world=state.world)


def typed(branch, kk: int, ref: jax.Array):
    """``branch`` at k = ``kk``, its per-device outputs (the indices to zero, the
    support, the statistics; not the sum, the same on every device) typed as varying
    like ``ref``, the accumulator: the two branches of the ``cond`` must agree under
    shard_map's check_vma."""
    def run(sel, state):
        summed, *per_device = branch(sel, state, kk)
        return (summed, *(varying_like(x, ref) for x in per_device))
    return run
