"""``grouped_topk_sync``'s configuration: every argument checked when the transform is built.

:class:`GroupedTopkConfig` is what the grouped step
(:func:`~jax_sparse_sync.transforms.grouped.grouped_sync`) reads: the shared
options (:class:`~jax_sparse_sync.transforms.sync_config.SparseSyncConfig`), the
plan, and the sparse allreduce's algorithm and wire format.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

from jax_sparse_sync.base.arguments import check_nan_policy, wire_word
from jax_sparse_sync.model.algorithm import resolve_algorithm
from jax_sparse_sync.transforms.sync_config import SparseSyncConfig

__all__ = ["GroupedTopkConfig"]

OP = "grouped_topk_sync"


@dataclasses.dataclass(frozen=True)
class GroupedTopkConfig:
    """grouped_topk_sync's options, checked (:meth:`build`).

    Attributes:
      shared: the options every sparse sync shares (:class:`SparseSyncConfig`).
      grouping: the plan as given (a ``GroupingPlan`` or ``(leaf ids, kind)``
        pairs); checked against the gradient's leaves at the first step
        (:func:`~jax_sparse_sync.transforms.grouped.normalize_groups`).
      algorithm: the sparse allreduce's algorithm (``"auto"``: chosen at trace time).
      wire_dtype, index_encoding: the sparse allreduce's wire format.
      wire: the value dtype's id (0 float32, 1 bfloat16, 2 float16).
    """

    shared: SparseSyncConfig
    grouping: Any
    algorithm: str = "auto"
    wire_dtype: Any = None
    index_encoding: str = "int32"
    wire: int = 0

    @classmethod
    def build(cls, grouping, *, density=None, k=None, algorithm="auto", comm=None,
              residual_dtype=jnp.float32, nan_policy="raise", wire_dtype=None,
              index_encoding="int32", warmup=None, flush_every=None,
              residual_decay=1.0) -> "GroupedTopkConfig":
        """The checked configuration (the errors name the argument and the fix)."""
        check_nan_policy(nan_policy, OP)
        shared = SparseSyncConfig.build(
            OP, density=density, k=k, comm=comm, residual_dtype=residual_dtype,
            nan_policy=nan_policy, warmup=warmup, flush_every=flush_every,
            residual_decay=residual_decay)
        if grouping is None or isinstance(grouping, str):
            raise shared.error(
                "`grouping` takes a plan, not a method name: "
                "jss.planning.plan_grouping(method, jss.planning.profile_backward(loss, params, "
                f"*batch), nranks=P, density=...) (got {grouping!r}); without a plan use "
                "jss.topk_sync")
        wire = wire_word(wire_dtype, index_encoding, OP) & 0xF
        if shared.on_mesh_axis:
            raise shared.error("grouping runs on MPI communicators; under shard_map use "
                               "jss.topk_sync (XLA schedules the collective)")
        if algorithm != "auto":
            # validate the name now; P is read at trace time (comm_size_in_trace)
            resolve_algorithm(algorithm, nranks=1, size=1, k=1)
        return cls(shared=shared, grouping=grouping, algorithm=algorithm, wire_dtype=wire_dtype,
                   index_encoding=index_encoding, wire=wire)

    @property
    def max_concurrent(self) -> int | None:
        """Simultaneous groups in flight at most: the plan's (``None``: no limit but
        the transport's slots, as for a sequence of pairs)."""
        return getattr(self.grouping, "max_concurrent", None)

    @property
    def wire_format(self) -> dict:
        """The sparse allreduce's wire-format arguments."""
        return dict(wire_dtype=self.wire_dtype, index_encoding=self.index_encoding)
