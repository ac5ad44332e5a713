"""``grouped_topk_sync``: ``topk_sync`` run group by group along a layer-grouping plan.

Its own transform because grouped execution has its own options: the plan, and
none of ``topk_sync``'s selection policies, quantization, warm-up, flushes or
leaky residuals (the groups select with the exact top-k in their own kernels,
each as soon as its gradients exist). The per-group update is
:func:`jax_sparse_sync.transforms.grouped.grouped_sync`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from jax_sparse_sync.base.arguments import check_nan_policy, wire_word
from jax_sparse_sync.base.transform_arguments import check_float_leaves, resolve_k
from jax_sparse_sync.model.algorithm import resolve_algorithm
from jax_sparse_sync.ops import transport
from jax_sparse_sync.transforms.flat import flat_residual, flat_size
from jax_sparse_sync.transforms.grouped import grouped_sync, normalize_groups
from jax_sparse_sync.transforms.topk_sync_state import TopkSyncState, initial_topk_sync_state
from jax_sparse_sync.transforms.world import check_world, world_marker

__all__ = ["grouped_topk_sync"]

_OP = "grouped_topk_sync"


def grouped_topk_sync(
    grouping,
    *,
    density: float | None = None,
    k: int | None = None,
    algorithm: str = "auto",
    comm=None,
    residual_dtype=jnp.float32,
    nan_policy: str = "raise",
    wire_dtype=None,
    index_encoding: str = "int32",
) -> optax.GradientTransformation:
    """Error-feedback Top-k per group of gradient leaves, overlapped with the backward pass.

    One exact top-k and one non-blocking sparse allreduce per group, each
    started as soon as its gradients exist so it overlaps the rest of the
    backward pass (ASC-WFBP; MPI communicators). Every group keeps its share of
    k (``round(k * n_g / N)``, at least 1). Simultaneous groups are held to the
    plan's ``max_concurrent`` in flight (a sequence of pairs: no limit but the
    transport's 8 slots). Every rank must use the same plan. A plan of one
    group of all leaves in tree order is ``topk_sync`` (exact selection) bit
    for bit.

    Args:
      grouping: a layer-grouping plan (``jss.planning.plan_grouping(...)``),
        or a sequence of ``(leaf ids, kind)`` with tree-order leaf ids in
        backward order and kind ``"normal"`` or ``"simultaneous"``.
      density, k, algorithm, comm, residual_dtype, nan_policy, wire_dtype,
        index_encoding: as :func:`~jax_sparse_sync.topk_sync`.

    Returns:
      An ``optax.GradientTransformation`` whose state is a
      :class:`~jax_sparse_sync.TopkSyncState` (the same layout as
      ``topk_sync``'s, so a checkpoint restores under either).

    Example:
      >>> import jax.numpy as jnp, optax, jax_sparse_sync as jss
      >>> params = {"b": jnp.zeros(4), "w": jnp.ones((4, 4))}
      >>> plan = [((1,), "normal"), ((0,), "simultaneous")]  # w's gradient is ready first
      >>> tx = optax.chain(jss.grouped_topk_sync(plan, k=2), optax.sgd(0.1))
      >>> state = tx.init(params)
      >>> grads = {"b": jnp.array([0., -3., 1., 0.]), "w": jnp.zeros((4, 4)).at[0, 0].set(5.0)}
      >>> updates, state = tx.update(grads, state, params)
      >>> [round(float(u), 4) for u in (updates["w"][0, 0], updates["b"][1])]
      [-0.5, 0.3]
    """
    check_nan_policy(nan_policy, _OP)
    if density is None and k is None:
        raise ValueError(f"jax_sparse_sync.{_OP}: pass `density=` (e.g. 0.01) or `k=`.")
    residual_dtype = jnp.dtype(residual_dtype)
    if not jnp.issubdtype(residual_dtype, jnp.floating):
        raise TypeError(f"jax_sparse_sync.{_OP}: `residual_dtype` must be a float dtype; "
                        f"got {residual_dtype}")
    if grouping is None or isinstance(grouping, str):
        raise ValueError(
            f"jax_sparse_sync.{_OP}: `grouping` takes a plan, not a method name: "
            "jss.planning.plan_grouping(method, jss.planning.profile_backward(loss, params, "
            f"*batch), nranks=P, density=...) (got {grouping!r}); without a plan use "
            "jss.topk_sync")
    wire = wire_word(wire_dtype, index_encoding, _OP) & 0xF
    comm = transport.resolve_comm(comm)
    if transport.is_mesh_axis(comm):
        raise ValueError(f"jax_sparse_sync.{_OP}: grouping runs on MPI communicators; under "
                         "shard_map use jss.topk_sync (XLA schedules the collective)")
    if algorithm != "auto":
        # validate the name now; P is read at trace time (comm_size_in_trace)
        resolve_algorithm(algorithm, nranks=1, size=1, k=1)

    def init_fn(params):
        check_float_leaves(params, "parameter", _OP)
        size = flat_size(params)
        if size == 0:
            raise ValueError(f"jax_sparse_sync.{_OP}: the parameters have no entries.")
        resolve_k(size=size, density=density, k=k)
        return initial_topk_sync_state(size, residual_dtype, world_marker(comm))

    def update_fn(updates, state, params=None):
        del params
        check_float_leaves(updates, "gradient", _OP)
        check_world(state.world, comm, _OP)
        size = flat_size(updates)
        residual = flat_residual(state.residual, size, residual_dtype, _OP)
        leaves = jax.tree_util.tree_leaves(updates)
        groups = normalize_groups(grouping, len(leaves), _OP)
        sums, new_residual, stats, kept, kth = grouped_sync(
            residual, leaves, groups, k_total=resolve_k(size=size, density=density, k=k),
            dtype=residual_dtype, algorithm=algorithm, comm=comm, nan_policy=nan_policy,
            seed=state.count, max_concurrent=getattr(grouping, "max_concurrent", None),
            last_kth=state.threshold, wire_dtype=wire_dtype, index_encoding=index_encoding,
            wire=wire)
        scale = transport.comm_size_in_trace(comm)
        treedef = jax.tree_util.tree_structure(updates)
        new_updates = jax.tree_util.tree_unflatten(treedef, [
            (s / scale).reshape(jnp.shape(x)).astype(jnp.result_type(x))
            for s, x in zip(sums, leaves)])
        return new_updates, TopkSyncState(
            count=optax.safe_increment(state.count), residual=new_residual,
            threshold=kth.astype(jnp.float32), last_local_count=jnp.asarray(kept, jnp.int32),
            last_stats=stats.astype(state.last_stats.dtype), world=state.world)

    return optax.GradientTransformation(init_fn, update_fn)
