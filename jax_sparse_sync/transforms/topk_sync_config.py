"""``topk_sync``'s configuration: every argument checked when the transform is built."""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import jax.numpy as jnp

from jax_sparse_sync.base.arguments import (check_nan_policy, check_quantization, wire_dtype_id,
                                             wire_word)
from jax_sparse_sync.base.transform_arguments import resolve_k
from jax_sparse_sync.model.algorithm import resolve_algorithm
from jax_sparse_sync.ops import transport
from jax_sparse_sync.transforms.sync_config import (SparseSyncConfig, check_capacity_factor,
                                                    check_choice, check_positive_int)
from jax_sparse_sync.transforms.topk_selection import SELECTION_TABLE, Selection

__all__ = ["TopkSyncConfig", "check_deprecated_grouping"]

OP = "topk_sync"
#: a wire id (0 float32, 1 bfloat16, 2 float16) -> the dtype the ops take
WIRE_DTYPES = (None, jnp.bfloat16, jnp.float16)


@dataclasses.dataclass(frozen=True)
class TopkSyncConfig:
    """topk_sync's options, checked (:meth:`build`).

    Attributes:
      shared: the options every sparse sync shares (:class:`SparseSyncConfig`).
      spec: the selection's :class:`Selection` (``selection`` its name).
      wire, warm_wire: the value wire ids (0 float32, 1 bfloat16, 2 float16) of
        the own density and of the warm-up phases; ``dense_wire`` that of a
        density-1 warm-up phase (float32 unless ``warmup_wire_dtype`` is set).
      warmup_wire_set: ``warmup_wire_dtype`` was given: the warm-up's rounding is
        dropped, not kept in the residual.
    """

    shared: SparseSyncConfig
    selection: str
    spec: Selection
    algorithm: str = "auto"
    quantize_bits: int = 0
    qsgd_bucket: int = 1024
    bucket: int = 512
    tau: int = 32
    capacity_factor: float = 2.0
    wire: int = 0
    warm_wire: int = 0
    dense_wire: int = 0
    warmup_wire_set: bool = False
    wire_dtype: Any = None
    index_encoding: str = "int32"

    @classmethod
    def build(cls, *, density, k, algorithm, comm, residual_dtype, nan_policy, quantize_bits,
              qsgd_bucket, selection, bucket, tau, capacity_factor, warmup, flush_every,
              residual_decay, wire_dtype, index_encoding, warmup_wire_dtype) -> "TopkSyncConfig":
        """The checked configuration (the errors name the argument and the fix)."""
        check_nan_policy(nan_policy, OP)
        wire = wire_word(wire_dtype, index_encoding, OP) & 0xF
        warm_wire = wire if warmup_wire_dtype is None else _warmup_wire(warmup_wire_dtype)
        shared = SparseSyncConfig.build(
            OP, density=density, k=k, comm=comm, residual_dtype=residual_dtype,
            nan_policy=nan_policy, warmup=warmup, flush_every=flush_every,
            residual_decay=residual_decay)
        spec = SELECTION_TABLE[check_choice(selection, SELECTION_TABLE, "selection", OP)]
        _check_selection(spec, selection, shared, wire or warm_wire or index_encoding != "int32",
                         quantize_bits, bucket)
        if warmup_wire_dtype is not None and not shared.warmup:
            raise shared.error("`warmup_wire_dtype` sets the wire of the `warmup` phases, and "
                               "there are none; pass warmup=... (e.g. jss.density_ramp(0.01, "
                               "steps_per_stage=25)) or use `wire_dtype`")
        if warm_wire and quantize_bits:
            raise shared.error("`warmup_wire_dtype` (16-bit values) and `quantize_bits` do not "
                               "combine; choose one")
        check_positive_int(tau, "tau", OP)
        check_capacity_factor(capacity_factor, OP)
        if algorithm != "auto":  # the name checked now; P is read at trace time
            resolve_algorithm(algorithm, nranks=1, size=1, k=1)
        check_quantization(quantize_bits, qsgd_bucket, algorithm, OP)
        return cls(shared=shared, selection=selection, spec=spec, algorithm=algorithm,
                   quantize_bits=quantize_bits, qsgd_bucket=qsgd_bucket, bucket=bucket, tau=tau,
                   capacity_factor=capacity_factor, wire=wire, warm_wire=warm_wire,
                   dense_wire=0 if warmup_wire_dtype is None else warm_wire,
                   warmup_wire_set=warmup_wire_dtype is not None, wire_dtype=wire_dtype,
                   index_encoding=index_encoding)

    @property
    def fused(self) -> bool:
        """The float32 exact top-k: the accumulate pass and the selection in one kernel."""
        return self.spec.local == "exact" and self.shared.residual_dtype == jnp.float32

    def kept(self, size: int, phase_density: float | None = None) -> int:
        """Entries kept: globally, or per bucket for ``selection="bucket"``."""
        if self.spec.local == "bucket":
            d, kk = ((self.shared.density, self.shared.k) if phase_density is None
                     else (phase_density, None))
            return resolve_k(size=min(size, self.bucket), density=d, k=kk)
        return self.shared.kept(size, phase_density)

    def capacity(self, size: int, k: int) -> int:
        """Slots of a threshold selection: ``capacity_factor * k`` (k for exact)."""
        if self.spec.local == "exact":
            return k
        return min(size, max(k, int(self.capacity_factor * k)))

    def branch_wire(self, phase_density) -> tuple[int, Any]:
        """(wire id, wire dtype) of a phase: the own density's, or the warm-up's."""
        if phase_density is None:
            return self.wire, self.wire_dtype
        return self.warm_wire, WIRE_DTYPES[self.warm_wire]


def _warmup_wire(warmup_wire_dtype) -> int:
    try:
        return wire_dtype_id(warmup_wire_dtype, OP)
    except ValueError:
        raise ValueError("jax_sparse_sync.topk_sync: `warmup_wire_dtype` must be None (the "
                         "warm-up on `wire_dtype`), jnp.float32, jnp.bfloat16 or jnp.float16; "
                         f"got {warmup_wire_dtype!r}") from None


def _check_selection(spec: Selection, selection: str, shared: SparseSyncConfig, coded: bool,
                     quantize_bits: int, bucket) -> None:
    """What the chosen selection does not take: 16-bit/encoded wires and QSGD where the
    values travel in a dense allreduce, mesh axes where it runs on MPI only."""
    if not spec.quantizable and coded:
        raise shared.error(f"selection={selection!r} sends its values with a dense allreduce; "
                           "wire_dtype, warmup_wire_dtype and index_encoding apply to the "
                           "selections whose entries go through the sparse allreduce")
    if not spec.quantizable and quantize_bits:
        raise shared.error(f"selection={selection!r} sends its values with a dense allreduce; "
                           "quantize_bits applies to algorithm='dsar_split_allgather' only (set "
                           "quantize_bits=0)")
    if not spec.mesh_axis and shared.on_mesh_axis:
        raise shared.error(f"selection={selection!r} runs on MPI communicators (comm=None or an "
                           "mpi4py communicator)")
    if selection == "bucket" and (not isinstance(bucket, int) or bucket < 1):
        raise shared.error(f"`bucket` must be a positive int; got {bucket!r}")


def check_deprecated_grouping(grouping, *, selection, quantize_bits, comm, residual_decay,
                              flush_every, warmup):
    """``topk_sync(grouping=plan)``: None (no grouping), or the plan after a
    DeprecationWarning, with the options the deprecated path does not take refused."""
    if grouping is None or (isinstance(grouping, str) and grouping == "none"):
        return None
    if isinstance(grouping, str):  # a mistake before a deprecation: the error first
        raise ValueError(
            "jax_sparse_sync.topk_sync: `grouping` takes a plan, not a method name: "
            "jss.grouped_topk_sync(jss.planning.auto_grouping(loss, params, *batch, density=...)) "
            "profiles, plans and logs one (or jss.planning.plan_grouping(method, "
            "jss.planning.profile_backward(loss, params, *batch), nranks=P, density=...)) "
            f"(got {grouping!r})")
    warnings.warn("jax_sparse_sync.topk_sync(grouping=...) is deprecated and will be removed "
                  "in the next release; use jss.grouped_topk_sync(grouping, density=..., ...)",
                  DeprecationWarning, stacklevel=3)
    refused = [
        (selection != "exact" or quantize_bits, "`grouping` needs selection='exact' and "
         "quantize_bits=0 (per-group thresholds are not implemented)"),
        (transport.is_mesh_axis(transport.resolve_comm(comm)), "`grouping` runs on MPI "
         "communicators; under shard_map leave grouping=None (XLA schedules the collective)"),
        (residual_decay != 1.0, "`residual_decay` with `grouping` is "
         "jss.grouped_topk_sync(grouping, residual_decay=..., density=...) "
         "(topk_sync(grouping=...) is deprecated)"),
        (flush_every is not None, "`flush_every` and `grouping` do not combine in the "
         "deprecated topk_sync(grouping=...); use jss.grouped_topk_sync(grouping, "
         "flush_every=..., density=...)"),
        (bool(warmup), "`warmup` and `grouping` do not combine in the deprecated "
         "topk_sync(grouping=...); use jss.grouped_topk_sync(grouping, warmup=..., density=...)"),
    ]
    for bad, message in refused:
        if bad:
            raise ValueError(f"jax_sparse_sync.topk_sync: {message}")
    return grouping
