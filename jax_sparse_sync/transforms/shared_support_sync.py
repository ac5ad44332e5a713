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

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jax_sparse_sync.base.arguments import check_nan_policy
from jax_sparse_sync.base.jax_compat import varying_axes, varying_like
from jax_sparse_sync.base.transform_arguments import check_float_leaves, resolve_k
from jax_sparse_sync.bindings.selection import residual_update, threshold_select, topk
from jax_sparse_sync.model.algorithm import resolve_algorithm
from jax_sparse_sync.ops import transport
from jax_sparse_sync.stats import STATS_FIELDS, stats_dtype
from jax_sparse_sync.transforms.accumulator_source import gradient_source
from jax_sparse_sync.transforms.cyclic_selection import dense_sum
from jax_sparse_sync.transforms.flat import flat_residual, flat_size, split_like
from jax_sparse_sync.transforms.selection_policy import (hinted_topk, kth_magnitude_of,
                                                            top_of_list)
from jax_sparse_sync.transforms.topk_sync import ExchangeArguments, sparse_exchange
from jax_sparse_sync.transforms.world import check_world, world_marker

__all__ = ["SharedSupportSyncState", "shared_support_sync", "support_of_sum", "random_offsets",
           "nth_outside"]

OP = "shared_support_sync"


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
    accumulate and gather k values, with no copy of the residual
    (``docs/topics/shared_support.md``: where the time goes).

    It trains behind ``topk_sync`` at the same density, the more so the
    rarer the refreshes: over a refresh period the run moves about k
    coordinates, and what waits off the support arrives at the refresh as
    one stale burst. Measured on the quick start's MLP (2 ranks, 1 %, 300
    steps; ``docs/topics/shared_support.md``): loss 0.147 at
    ``refresh_every=2``, 0.667 at 4, diverged at 16, against 0.097 for
    ``topk_sync`` and 0.091 dense. ``random_fraction`` did not close that
    gap: 0.13-0.19 over three seeds at 0.1, 0.15-0.25 at 0.25, 0.24 at 0.5.

    Under ``jax.shard_map`` pass ``check_vma=False`` (with ``check_vma=True``
    the support, read from the per-device state, types as varying, and so
    would the update; the step raises saying so).

    Args:
      density: fraction of entries kept per step, in (0, 1]. Exclusive with ``k``.
      k: number of entries kept per step, in [1, N].
      refresh_every: steps between support refreshes (an int >= 1): steps
        0, ``refresh_every``, ``2 refresh_every``, ... run the sparse exchange.
        The default, 2, trained best of 2, 4 and 16 in the runs above.
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
    check_nan_policy(nan_policy, OP)
    if density is None and k is None:
        raise ValueError(f"jax_sparse_sync.{OP}: pass `density=` (e.g. 0.01) or `k=`.")
    if density is not None and k is not None:
        raise ValueError(f"jax_sparse_sync.{OP}: pass exactly one of `density` or `k`.")
    if density is not None:
        resolve_k(size=1, density=density, k=None, op=OP)  # the range, before any step
    elif isinstance(k, bool) or not isinstance(k, int):
        raise TypeError(f"jax_sparse_sync.{OP}: `k` must be an int; got {k!r}")
    elif k < 1:
        raise ValueError(f"jax_sparse_sync.{OP}: `k` must be in [1, N] (N: the number of "
                         f"gradient entries); got k={k}")
    if isinstance(refresh_every, bool) or not isinstance(refresh_every, int) \
            or refresh_every < 1:
        raise ValueError(f"jax_sparse_sync.{OP}: `refresh_every` must be an int >= 1 (steps "
                         f"between sparse exchanges that choose the shared support; 1 is "
                         f"topk_sync(selection='exact')); got {refresh_every!r}")
    if isinstance(random_fraction, bool) or not isinstance(random_fraction, (int, float)) \
            or not 0.0 <= random_fraction <= 1.0:
        raise ValueError(f"jax_sparse_sync.{OP}: `random_fraction` must be a number in [0, 1] "
                         f"(the part of the k coordinates each step between refreshes draws at "
                         f"random; 0: none); got {random_fraction!r}")
    if random_fraction and refresh_every == 1:
        raise ValueError(f"jax_sparse_sync.{OP}: `random_fraction` moves the support on the "
                         f"steps between refreshes, and refresh_every=1 has none (every step is "
                         f"topk_sync's); pass refresh_every >= 2, or random_fraction=0")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"jax_sparse_sync.{OP}: `seed` must be an int (the same on every "
                        f"rank); got {seed!r}")
    residual_dtype = jnp.dtype(residual_dtype)
    if not jnp.issubdtype(residual_dtype, jnp.floating):
        raise TypeError(f"jax_sparse_sync.{OP}: `residual_dtype` must be a float dtype; "
                        f"got {residual_dtype}")
    if algorithm != "auto":
        resolve_algorithm(algorithm, nranks=1, size=1, k=1)  # the name, now
    comm = transport.resolve_comm(comm)

    def kept(size: int) -> tuple[int, int]:
        # (k, the support's part of it: the rest is drawn at random each shared step)
        kk = resolve_k(size=size, density=density, k=k, op=OP)
        return kk, kk - int(round(random_fraction * kk))

    def init_fn(params):
        check_float_leaves(params, "parameter", OP)
        size = flat_size(params)
        if size == 0:
            raise ValueError(f"jax_sparse_sync.{OP}: the parameters have no entries.")
        _, k_fixed = kept(size)
        if random_fraction and not transport.is_mesh_axis(comm):
            check_same_seed(comm)
        return SharedSupportSyncState(
            count=jnp.zeros((), jnp.int32),
            residual=jnp.zeros((size,), residual_dtype),
            support=jnp.arange(k_fixed, dtype=jnp.int32),  # replaced by the first (refresh) step
            threshold=jnp.zeros((), jnp.float32),
            last_stats=jnp.zeros((len(STATS_FIELDS),), stats_dtype()),
            world=world_marker(comm))

    def update_fn(updates, state, params=None):
        del params
        check_float_leaves(updates, "gradient", OP)
        check_world(state.world, comm, OP)
        size = flat_size(updates)
        kk, k_fixed = kept(size)
        residual = flat_residual(state.residual, size, residual_dtype, OP)
        if tuple(jnp.shape(state.support)) != (k_fixed,):
            raise ValueError(f"jax_sparse_sync.{OP}: the state's support holds "
                             f"{jnp.shape(state.support)} entries but this step keeps "
                             f"{k_fixed} (k={kk}, random_fraction={random_fraction}); was the "
                             "state initialised for other parameters, another k or another "
                             "random_fraction?")
        if refresh_every > 1 and transport.is_mesh_axis(comm) \
                and comm.name in varying_axes(state.support):
            # the update would be scattered at per-device positions: shard_map types
            # it varying, and only a collective (index traffic) could type it replicated
            raise ValueError(
                f"jax_sparse_sync.{OP}: under shard_map with check_vma=True the support "
                f"read from the per-device state is typed as varying over {comm.name!r}, "
                "and so would the update be; pass check_vma=False to jax.shard_map (the "
                "support is the same on every device by construction), or use "
                "refresh_every=1")
        # The accumulate pass (acc = residual + grad, in the residual's buffer) before
        # the exchange's branches and the residual update after them, both in place:
        # inside a branch of the cond, XLA copies every N-entry buffer written in place.
        acc, local = accumulated(residual, updates, state, kk)
        sel = acc if acc.dtype in SELECTABLE else acc.astype(jnp.float32)
        refresh_exchange = refresh_exchange_of(local)
        if refresh_every == 1:
            summed, sent, support, threshold, stats = refresh_exchange(sel, state, kk)
        else:
            summed, sent, support, threshold, stats = jax.lax.cond(
                state.count % refresh_every == 0, typed(refresh_exchange, kk, sel),
                typed(shared_exchange, kk, sel), sel, state)
        new_updates = split_like(summed, updates, scale=transport.comm_size_in_trace(comm))
        return new_updates, SharedSupportSyncState(
            count=optax.safe_increment(state.count), residual=zero_at(acc, sent),
            support=support.astype(jnp.int32),
            threshold=threshold,
            last_stats=stats.astype(state.last_stats.dtype), world=state.world)

    # float32: the refresh step's local top-k from the entries above 0.95 of the
    # hint (the last refresh's k-th magnitude, state.threshold); the other residual
    # dtypes select with jss.topk and keep the threshold as it is
    hinted = residual_dtype == jnp.float32
    source = gradient_source(residual_dtype)

    def accumulated(residual, updates, state, kk):
        """(acc, the local exact top-k (values, indices), or None: the refresh step's to select)."""
        if hinted and refresh_every == 1:
            # every step refreshes (no cond): topk_sync's fused accumulate-and-select
            produced = source.produce(residual, updates, None, kk, state.threshold)
            return produced.acc, (produced.values, produced.indices)
        # the plain in-place accumulate on every step, outside the cond (within a
        # branch XLA copied the residual before writing it: one f32[N] copy a step);
        # the refresh branch selects from acc
        return source.produce(residual, updates, None, None, None).acc, None

    def local_top_k(sel, state, kk):
        """A refresh step's exact local top-k of the accumulator, and the next hint."""
        if not hinted:
            return topk(sel, kk), state.threshold
        values, indices = hinted_topk(sel, kk, state.threshold)
        return (values, indices), kth_magnitude_of(values)

    def refresh_exchange_of(local):
        def refresh_exchange(sel, state, kk):
            # topk_sync(selection="exact")'s exchange: local exact top-k, sparse allreduce
            if local is None:
                (values, indices), threshold = local_top_k(sel, state, kk)
            else:
                (values, indices), threshold = local, kth_magnitude_of(local[0])
            summed, indices, stats = sparse_exchange(sel, values, indices, ExchangeArguments(
                size=sel.shape[0], k=kk, step=state.count, comm=comm, algorithm=algorithm,
                nan_policy=nan_policy, quantize_bits=0, qsgd_bucket=1024))
            # the same bits on every rank, the same ties to the lower index: the same
            # support; the sum has at most P k nonzeros (the ranks' selections)
            nonzeros = min(sel.shape[0], transport.comm_size_in_trace(comm) * kk)
            k_fixed = state.support.shape[0]
            return (summed, indices, support_of_sum(summed, k_fixed, nonzeros), threshold,
                    stats)
        return refresh_exchange

    def shared_exchange(sel, state, kk):
        support = state.support
        sent = support
        if kk > support.shape[0]:  # and as many drawn off the support (all distinct)
            n, drawn = sel.shape[0], kk - support.shape[0]
            offsets = random_offsets(seed, state.count, n - support.shape[0], drawn)
            sent = jnp.concatenate([support, nth_outside(support, offsets)])
        values, stats = dense_sum(sel[sent].astype(jnp.float32), comm, nan_policy)
        summed = jnp.zeros((sel.shape[0],), jnp.float32).at[sent].set(
            values, unique_indices=True)
        return summed, sent, support, state.threshold, stats  # no selection: the hint stays

    def check_same_seed(mpi_comm):
        # the draws must be the same on every rank; a per-rank seed (seed=rank) would
        # send values from different coordinates, summed as if they were the same
        seeds = mpi_comm.allgather(int(seed))
        if len(set(seeds)) > 1:
            raise ValueError(f"jax_sparse_sync.{OP}: `seed` must be the same on every rank "
                             f"(the random part of the support is drawn from it without a "
                             f"message); the ranks passed {seeds}")

    return optax.GradientTransformation(init_fn, update_fn)


#: accumulator dtypes the selection kernels and ``residual_update`` take as they are
SELECTABLE = (jnp.float32, jnp.bfloat16, jnp.float16)


def zero_at(acc: jax.Array, indices: jax.Array) -> jax.Array:
    """``acc`` with ``indices`` zeroed (index -1: none), in place where the kernel applies."""
    if acc.dtype in SELECTABLE:
        return residual_update(acc, indices)
    size = acc.shape[0]  # float64 residuals (x64): the XLA scatter
    return acc.at[jnp.where(indices < 0, size, indices)].set(0, mode="drop")


def support_of_sum(summed: jax.Array, k: int, nonzeros: int) -> jax.Array:
    """``jss.topk(summed, k)``'s indices bit for bit, read from ``summed``'s nonzeros.

    The k largest magnitudes of ``summed`` (NaN above everything, ties to the
    lower index), and, where ``summed`` has fewer than k nonzeros, all of them
    and the lowest-indexed zeros (``-0.0`` counts as zero), in ascending order.
    One pass over ``summed`` lists its nonzeros (``jss.threshold_select``; a
    sparse allreduce's sum has at most P k), then a top-k of that list of
    ``nonzeros`` slots, instead of a radix select over all N entries (several
    passes, each starting the CPU's threads). Should more than ``nonzeros``
    entries be nonzero, it selects from the whole of ``summed``.

    Args:
      summed: (N,) float32.
      k: entries to choose, ``0 <= k <= N``.
      nonzeros: static bound on the nonzeros of ``summed`` (``k <= nonzeros <= N``).

    Returns:
      (k,) int32 indices, ascending.

    Example:
      >>> import jax.numpy as jnp
      >>> from jax_sparse_sync.transforms.shared_support_sync import support_of_sum
      >>> support_of_sum(jnp.array([0., 2., 0., -2., 1.]), 2, nonzeros=3).tolist()
      [1, 3]
      >>> support_of_sum(jnp.array([0., 0., 0., 5., 0.]), 3, nonzeros=3).tolist()
      [0, 1, 3]
    """
    n = summed.shape[0]
    if k == 0:
        return jnp.zeros((0,), jnp.int32)

    def over_all_of_summed():
        return topk(summed, k)[1]

    if nonzeros > n // 2:
        # a list of more than half of summed (many ranks, a high density) costs more
        # than the radix select over all of it
        return over_all_of_summed()
    values, indices, count = threshold_select(summed, -1.0, nonzeros)

    def of_the_list():
        # the listed entries are summed's nonzeros in index order: while there are k
        # of them, their top k (ties to the lower index) are summed's, in index order
        return top_of_list(values, indices, k)[1]

    def all_and_zeros():
        # fewer than k nonzeros: all of them, and the lowest-indexed zeros
        window = min(n, 2 * k)  # holds at least k - count zeros
        listed = indices[:k]  # the count nonzeros in front, then -1 padding
        is_nonzero = jnp.zeros((window,), bool).at[jnp.where(listed >= 0, listed, window)].set(
            True, mode="drop")
        zeros = jnp.nonzero(~is_nonzero, size=k, fill_value=0)[0].astype(jnp.int32)
        slot = jnp.arange(k, dtype=jnp.int32)
        return jnp.sort(jnp.where(slot < count, listed, zeros[jnp.maximum(slot - count, 0)]))

    # (more nonzeros than the bound: selected from the whole of summed)
    case = jnp.where(count > nonzeros, 2, jnp.where(count >= k, 0, 1))
    return jax.lax.switch(case, [of_the_list, all_and_zeros, over_all_of_summed])


def random_offsets(seed: int, step: jax.Array, m: int, r: int) -> jax.Array:
    """``r`` distinct offsets into ``[0, m)``, ascending: one drawn uniformly from
    each of ``r`` equal strata (``[i m // r, (i + 1) m // r)``) by a PRNG keyed by
    ``seed`` and ``step``, so the same on every rank for the same step.

    Args:
      seed: an int.
      step: the step count (an int32 scalar, may be traced).
      m: the range, ``r <= m < 2**31``.
      r: how many.

    Returns:
      (r,) int32.

    Example:
      >>> from jax_sparse_sync.transforms.shared_support_sync import random_offsets
      >>> o = random_offsets(0, 3, 10, 2)
      >>> bool(0 <= o[0] < 5 <= o[1] < 10)
      True
    """
    bounds = np.arange(r + 1, dtype=np.int64) * m // r  # static: the strata
    key = jax.random.fold_in(jax.random.PRNGKey(seed), step)
    within = jax.random.randint(key, (r,), 0, jnp.asarray(np.diff(bounds), jnp.int32),
                                dtype=jnp.int32)
    return jnp.asarray(bounds[:-1], jnp.int32) + within


def nth_outside(support: jax.Array, offsets: jax.Array) -> jax.Array:
    """The ``offsets``-th coordinates (0-based) of ``[0, N)`` without ``support``.

    ``np.setdiff1d(np.arange(N), support)[offsets]``, without the N entries: the
    ``u``-th coordinate off an ascending ``support`` is ``u`` plus the number of
    ``j`` with ``support[j] - j <= u``. Ascending offsets give ascending, distinct
    coordinates.

    Args:
      support: (s,) int32, ascending and distinct.
      offsets: int32, each in ``[0, N - s)``.

    Example:
      >>> import jax.numpy as jnp
      >>> from jax_sparse_sync.transforms.shared_support_sync import nth_outside
      >>> nth_outside(jnp.array([0, 1, 4], jnp.int32), jnp.array([0, 1, 2], jnp.int32)).tolist()
      [2, 3, 5]
    """
    if support.shape[0] == 0:
        return offsets
    gaps = support - jnp.arange(support.shape[0], dtype=support.dtype)  # non-decreasing
    return offsets + jnp.searchsorted(gaps, offsets, side="right").astype(offsets.dtype)


def typed(exchange, kk: int, ref: jax.Array):
    """``exchange`` at k = ``kk``, its per-device outputs (the indices to zero, the
    support, the statistics; not the sum, the same on every device) typed as varying
    like ``ref``, the accumulator: the two branches of the ``cond`` must agree under
    shard_map's check_vma."""
    def run(sel, state):
        summed, *per_device = exchange(sel, state, kk)
        return (summed, *(varying_like(x, ref) for x in per_device))
    return run
