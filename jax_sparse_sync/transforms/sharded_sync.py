"""``sharded_sync``: sparse sync with sharded optimizer state (ZeRO-style).

The factory builds a :class:`~jax_sparse_sync.transforms.sharded_config.ShardedSyncConfig`
(every argument checked once, the inner optimizer checked elementwise); a step is
the shared accumulate phase with its exact top-k, then the phases of
:mod:`~jax_sparse_sync.transforms.sharded_phases` (reduce at the owners, the inner
optimizer on each owner's region, the change compressed and gathered), then the
residual settled (:func:`sharded_step`).
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jax_sparse_sync.model.sharded import CHANGES
from jax_sparse_sync.stats import STATS_FIELDS, add_traffic, stats_dtype
from jax_sparse_sync.transforms.accumulator_source import gradient_source
from jax_sparse_sync.transforms.flat import split_like
from jax_sparse_sync.transforms.phases import accumulate, begin_step, init_size, settle
from jax_sparse_sync.transforms.sharded_config import OP, ShardedSyncConfig
from jax_sparse_sync.transforms.sharded_phases import (clip_phase, compress_phase,
                                                       gather_phase, inner_phase, reduce_phase,
                                                       region_of, region_params)
from jax_sparse_sync.transforms.world import check_world, world_marker

__all__ = ["ShardedSyncState", "sharded_sync", "sharded_step", "CHANGES"]


class ShardedSyncState(NamedTuple):
    """State of :func:`sharded_sync`: arrays only, it checkpoints with the optimizer.

    Attributes:
      count: steps taken (int32).
      residual: this rank's error feedback of its gradient, flat (N,) float32 in
        ``jax.tree_util`` order (as :class:`~jax_sparse_sync.TopkSyncState`'s):
        per rank, like the gradient it holds back.
      inner: the inner optimizer's state on this rank's region only: every
        per-parameter leaf has ``ceil(N / P)`` entries (the region, zero-padded
        at its end), the scalar leaves (a step count) are the same on every rank.
      change_residual: the owner's error feedback of its region's change,
        ``ceil(N / P)`` float32, with ``change="topk"``; an empty (0,) array
        otherwise.
      last_stats: wire statistics of the last step (``jss.SyncStats`` layout):
        both exchanges' bytes and messages; ``result_nnz`` the entries of the
        change applied, ``algorithm`` the change's gather (``split_allgather``,
        or ``dsar_split_allgather`` for ``"dense"``).
      reduce_stats: the first exchange's own statistics (``region_reduce``;
        ``result_nnz`` the entries the owners summed; with ``max_grad_norm`` the
        bytes and messages of the norm's gather added).
      world: int32 (P,), 1 at this rank (MPI; ``None`` on a mesh axis): the
        world size the regions were cut for. A step at another size raises,
        naming :func:`jss.reshard_state`, which re-cuts them.
    """

    count: jax.Array
    residual: jax.Array
    inner: Any
    change_residual: jax.Array
    last_stats: jax.Array
    reduce_stats: jax.Array
    world: Any = None


def init_state(config: ShardedSyncConfig, params) -> ShardedSyncState:
    """The state before the first step: the inner optimizer's state of this rank's
    region of ``params`` (inside shard_map on a mesh axis, where the region is the
    device's)."""
    n = init_size(config.shared, params)
    region = region_of(config.shared.comm, n, OP)
    change = config.resolved_change(n, region.nranks)
    zeros_stats = jnp.zeros((len(STATS_FIELDS),), stats_dtype())
    return ShardedSyncState(
        count=jnp.zeros((), jnp.int32),
        residual=jnp.zeros((n,), jnp.float32),
        inner=config.inner.init(region_params(params, region)),
        change_residual=jnp.zeros((region.slot if change == "topk" else 0,), jnp.float32),
        last_stats=zeros_stats, reduce_stats=zeros_stats,
        world=world_marker(config.shared.comm))


def sharded_step(config: ShardedSyncConfig, updates, state: ShardedSyncState, params):
    """One step: ``(the change of every parameter (the update to apply), new state)``."""
    shared = config.shared
    source = gradient_source(jnp.float32)
    like, n, residual = begin_step(shared, source, updates, state.residual,
                                   lambda: check_world(state.world, shared.comm, OP))
    region = region_of(shared.comm, n, OP)
    change = config.resolved_change(n, region.nranks)
    k = shared.kept(n)
    produced = accumulate(shared, source, residual, updates, state.count, k=k)
    grad, summed, reduce_stats = reduce_phase(config, produced.values, produced.indices, region)
    if config.max_grad_norm is not None:
        grad, clip_stats = clip_phase(config, grad, region)
        reduce_stats = add_traffic(reduce_stats, clip_stats.astype(reduce_stats.dtype))
    touched = (summed != 0) if change == "lazy" else None
    update, inner = inner_phase(config, grad, state.inner, region_params(params, region),
                                region, touched)
    values, indices, change_residual = compress_phase(
        change, update, state.change_residual, region, change_k=config.change_k(n, region.nranks),
        capacity=min(region.slot, region.nranks * k), touched=touched)
    applied, gather_stats = gather_phase(config, change, values, indices, region)
    new_residual = settle(produced.acc, produced.indices, None)
    dt = state.last_stats.dtype
    return split_like(applied, like), ShardedSyncState(
        count=optax.safe_increment(state.count), residual=new_residual, inner=inner,
        change_residual=change_residual,
        last_stats=add_traffic(gather_stats.astype(dt), reduce_stats.astype(dt)),
        reduce_stats=reduce_stats.astype(dt), world=state.world)


def sharded_sync(
    inner: optax.GradientTransformation,
    *,
    density: float | None = None,
    k: int | None = None,
    change: str = "auto",
    change_density: float | None = None,
    max_grad_norm: float | None = None,
    comm=None,
    nan_policy: str = "raise",
) -> optax.GradientTransformationExtraArgs:
    """Sparse sync with sharded optimizer state: each rank owns a region, as ZeRO does.

    Each rank owns a fixed contiguous region of the flattened parameters (rank q of
    P: ``[q N / P, (q + 1) N / P)``, balanced by size and the same every step, so
    the state never moves) and keeps the inner optimizer's state of that region
    only: ``ceil(N / P)`` entries per moment instead of N. Each step, on every rank:

    1. ``acc = residual + grad``; the exact top-k of ``|acc|`` is selected and
       zeroed in the residual (error feedback, as :func:`jss.topk_sync`);
    2. the selected entries are summed at their region's owner and nowhere else
       (Ok-Topk's reduction on fixed regions, no re-balancing; split-allgather's
       first phase): the owner holds its region's sum, divided by P;
    3. the owner runs ``inner`` on its region with its shard of the state;
    4. the region's change (dense even when the gradient was sparse: Adam moves
       every entry with momentum) travels as ``change`` says, and every rank
       applies the same gathered change, so replicas stay bitwise identical.

    ``change``: ``"topk"``: the owner sends the top k (or ``change_density``) of
    ``change_residual + change`` and keeps the rest in its own residual (its
    region's error feedback: DoubleSqueeze's compression of both directions);
    ``"lazy"``: only the entries whose reduced gradient is nonzero move, with
    their exact change, and only their state is updated (lazy Adam: the other
    entries' moments stay as they were, neither decayed nor stepped; the step
    count advances every step, so bias correction follows the global step, as
    in TensorFlow's LazyAdam); ``"dense"``: the whole change, gathered dense
    (the baseline); ``"auto"``: the one the cost model predicts fastest for
    (P, N, k) (:func:`jax_sparse_sync.model.sharded.choose_change`).

    Args:
      inner: the optimizer the owners run, e.g. ``optax.adamw(1e-3)``. It must be
        elementwise (checked when the transform is built): every state leaf a
        scalar or one entry per parameter, every entry's update a function of its
        own gradient, parameter and state (Adam, AdamW, SGD with momentum, RMSProp,
        Lion, with schedules). It sees the region as one float32 vector, so masks
        over the parameter tree (``optax.masked``, a weight-decay mask) do not
        apply: put per-leaf transformations before the sync.
      density: fraction of the gradient entries each rank selects, in (0, 1].
        Exclusive with ``k``.
      k: entries each rank selects.
      change: one of ``"topk"``, ``"lazy"``, ``"dense"``, ``"auto"`` (above).
      change_density: with ``"topk"``, the fraction of its region an owner sends
        (``ceil(change_density * ceil(N / P))`` entries); ``None``: k entries, about
        as many as the region's reduced gradient holds (each of the P ranks' k
        selected entries falls in a region with probability 1/P), so the sparse
        change sends about what ``"lazy"`` does.
      max_grad_norm: clip the reduced gradient (the mean over ranks) by its global
        norm before ``inner`` runs, as ``optax.clip_by_global_norm`` in front of a
        replicated optimizer clips it (each owner's sum of squares gathered: P floats,
        added in rank order). ``inner`` itself cannot clip (it sees one region);
        ``optax.clip_by_global_norm`` chained in front of the sync clips each rank's
        own gradient instead. ``None``: no clipping.
      comm: mpi4py communicator (``None``: the library's clone of COMM_WORLD), or
        ``jss.axis(name)`` inside ``jax.shard_map`` (call ``init`` and ``update``
        there): the residual per device, the region state the device's shard
        (shard the state over the axis; another mesh axis can shard the
        parameters themselves, FSDP-style, and the regions then cut each device's
        own parameters).
      nan_policy: ``"raise"`` or ``"propagate"``, as in :func:`jss.topk_sync`.

    Cost: per step one pass over the N entries (the accumulator and its top-k),
    the reduce (about ``8 k (P-1)/P`` bytes), the inner optimizer on ``N / P``
    entries, and the change's gather (``"topk"``: ``8 k (P-1)`` bytes by default).
    Bytes exactly: :mod:`jax_sparse_sync.model.sharded`. Measured:
    docs/topics/sharded_state.md. Checkpoints restore at another P with
    :func:`jss.reshard_state`, which re-cuts the regions.

    Returns:
      An ``optax.GradientTransformationExtraArgs`` with a :class:`ShardedSyncState`;
      its ``update(grads, state, params)`` returns the change to apply
      (``optax.apply_updates(params, updates)``): chain no optimizer after it.

    Example:
      >>> import jax.numpy as jnp, optax, jax_sparse_sync as jss
      >>> tx = jss.sharded_sync(optax.sgd(0.5), k=2, change="dense")
      >>> params = {"w": jnp.zeros(4)}
      >>> updates, state = tx.update({"w": jnp.array([4., 0.1, -2., 0.3])}, tx.init(params),
      ...                            params)
      >>> updates["w"].tolist(), state.residual.tolist()
      ([-2.0, -0.0, 1.0, -0.0], [0.0, 0.10000000149011612, 0.0, 0.30000001192092896])
    """
    config = ShardedSyncConfig.build(inner, density=density, k=k, change=change,
                                     change_density=change_density,
                                     max_grad_norm=max_grad_norm, comm=comm,
                                     nan_policy=nan_policy)

    def update_fn(updates, state, params=None, **extra_args):
        del extra_args
        return sharded_step(config, updates, state, params)

    return optax.GradientTransformationExtraArgs(functools.partial(init_state, config), update_fn)
