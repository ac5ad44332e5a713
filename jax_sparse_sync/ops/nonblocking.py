"""Non-blocking sparse allreduce: ``sparse_allreduce_start`` / ``sparse_allreduce_done``.

``start`` checks the arguments on every rank and hands the collective to a
worker thread; ``done`` waits for it. Work placed between the two overlaps the
communication, and several allreduces can be in flight at once. Both calls
carry the MPI ordered effect, so every rank issues the same sequence.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jax_sparse_sync import _ext
from jax_sparse_sync.mpi.nonblocking import (MAX_WINDOW, START_DEFER_CHECK, START_WAIT_PREVIOUS,
                                             START_WINDOW_SHIFT, done_p, start_p)
from jax_sparse_sync.mpi.sparse_allreduce import call_arguments
from jax_sparse_sync.ops import transport
from jax_sparse_sync.stats import SyncStats

__all__ = ["PendingAllreduce", "sparse_allreduce_start", "sparse_allreduce_done",
           "TimelineRecord", "nonblocking_timeline"]

@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PendingAllreduce:
    """A started sparse allreduce: pass it to :func:`sparse_allreduce_done` once.

    ``handle`` is an int32 scalar array (it may cross ``jit`` boundaries);
    ``size`` and ``dtype`` are static.
    """

    handle: jax.Array
    size: int = dataclasses.field(metadata=dict(static=True))
    dtype: str = dataclasses.field(metadata=dict(static=True))


def sparse_allreduce_start(values: jax.Array, indices: jax.Array, *, size: int,
                           algorithm: str = "auto", comm=None, nan_policy: str = "raise",
                           quantize_bits: int = 0, qsgd_bucket: int = 1024,
                           seed: int | jax.Array = 0, wire_dtype=None,
                           index_encoding: str = "int32", wait_for_previous: bool = False,
                           max_in_flight: int | None = None,
                           defer_checks: bool = False) -> PendingAllreduce:
    """Starts a sparse allreduce; arguments as :func:`sparse_allreduce`, and:

    Args:
      wait_for_previous: the worker puts nothing on the wire before every
        operation started earlier on this communicator has finished (one
        message at a time on the link, as WFBP's "normal" layers), without
        blocking the caller. ``False``: it runs concurrently with the ones in
        flight (ASC-WFBP's "simultaneous" layers), up to ``max_in_flight``.
      max_in_flight: with ``wait_for_previous=False``: the worker waits (the
        caller does not) until every operation started on this communicator
        ``max_in_flight`` or more starts before it has finished, so at most
        ``max_in_flight`` are on the wire, itself included (the planner's
        ``max_concurrent``); 1 to 255. ``None``: no limit beyond the 8 slots.
      defer_checks: run the cross-rank argument check (a small allgather) on
        the worker too, so ``start`` makes no MPI call on the caller's thread
        and never waits for the other ranks; a bad argument (or a NaN under
        ``nan_policy="raise"``) then fails at :func:`sparse_allreduce_done`,
        on every rank alike. ``False``: it fails here.

    Bad arguments fail here (at done with ``defer_checks``), on every rank.
    Up to 8 allreduces per communicator run concurrently; a ninth queues on
    its worker thread until the one 8 starts before it has finished (the
    caller goes on; every result stays available). Call
    :func:`sparse_allreduce_done` on every handle, on every rank, in the same
    order as the other ranks.

    Example:
      >>> import jax.numpy as jnp, jax_sparse_sync as jss
      >>> i = jnp.array([0, 2], jnp.int32)
      >>> a = jss.sparse_allreduce_start(jnp.array([1., 2.]), i, size=3, algorithm="allgather")
      >>> b = jss.sparse_allreduce_start(jnp.array([5., 6.]), i, size=3, algorithm="recursive_doubling")
      >>> jss.sparse_allreduce_done(b).tolist(), jss.sparse_allreduce_done(a).tolist()
      ([5.0, 0.0, 6.0], [1.0, 0.0, 2.0])
    """
    values = jnp.asarray(values)
    comm = transport.resolve_mpi_comm(comm, "sparse_allreduce_start")
    operands, params = call_arguments(
        values, indices, size=size, algorithm=algorithm, comm=comm, nan_policy=nan_policy,
        quantize_bits=quantize_bits, qsgd_bucket=qsgd_bucket, seed=seed,
        op="sparse_allreduce_start", wire_dtype=wire_dtype, index_encoding=index_encoding)
    if max_in_flight is not None:
        if isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int) or \
                not 1 <= max_in_flight <= MAX_WINDOW:
            raise ValueError("jax_sparse_sync.sparse_allreduce_start: `max_in_flight` must be "
                             f"None or an int in [1, {MAX_WINDOW}]; got {max_in_flight!r}")
        if wait_for_previous:
            raise ValueError("jax_sparse_sync.sparse_allreduce_start: pass `wait_for_previous` "
                             "or `max_in_flight`, not both (wait_for_previous is "
                             "max_in_flight=1)")
    flags = (START_WAIT_PREVIOUS if wait_for_previous else 0) | \
        (START_DEFER_CHECK if defer_checks else 0) | \
        ((max_in_flight or 0) << START_WINDOW_SHIFT)
    (handle,) = start_p.bind(*operands, flags=flags, **params)
    return PendingAllreduce(handle=handle, size=params["size"], dtype=str(values.dtype))


def sparse_allreduce_done(pending: PendingAllreduce, *, return_stats: bool = False):
    """Waits for a started allreduce; returns what :func:`sparse_allreduce` would."""
    if not isinstance(pending, PendingAllreduce):
        raise TypeError("jax_sparse_sync.sparse_allreduce_done: pass the PendingAllreduce that "
                        f"sparse_allreduce_start returned; got {type(pending).__name__}")
    out, stats = done_p.bind(pending.handle, size=pending.size)
    if pending.dtype != "float32":
        out = out.astype(pending.dtype)
    return (out, SyncStats.from_vector(stats)) if return_stats else out


class TimelineRecord(NamedTuple):
    """When one finished non-blocking allreduce of this process ran.

    Times are ``time.monotonic()`` seconds (the C++ side reads the same
    clock), so they line up with timestamps taken in Python around a step.
    """

    op: int             #: operation number in this process's CPU or CUDA module (start order)
    size: int           #: dense length of the result
    bytes_sent: int     #: bytes this rank sent
    start: float        #: start called (the group's gradients and selection exist)
    checked: float      #: argument check done (a header allgather: ranks met here)
    wire_begin: float   #: the worker thread began the algorithm
    wire_end: float     #: the algorithm returned
    done: float         #: done called
    done_exit: float    #: done returned (the result is in XLA's buffer)


def nonblocking_timeline(clear: bool = True) -> list[TimelineRecord]:
    """The finished non-blocking allreduces of this process, oldest first.

    Every :func:`sparse_allreduce_start` / :func:`sparse_allreduce_done` pair
    (and so every group of a grouped ``topk_sync``) records when it was
    started, when the ranks had checked its arguments, when it was on the wire
    and when it was waited for; the last 65536 are kept: enough to draw a
    step's timeline of the groups' communication.

    Args:
      clear: forget the returned records, so the next call returns only newer ones.

    Example:
      >>> import time, jax.numpy as jnp, jax_sparse_sync as jss
      >>> _ = jss.planning.nonblocking_timeline()
      >>> t0 = time.monotonic()
      >>> h = jss.sparse_allreduce_start(jnp.array([1.]), jnp.array([0], jnp.int32), size=2)
      >>> _ = jss.sparse_allreduce_done(h).block_until_ready()
      >>> (rec,) = jss.planning.nonblocking_timeline()
      >>> t0 <= rec.start <= rec.wire_begin <= rec.wire_end <= rec.done_exit, rec.size
      (True, 2)
    """
    # The CPU and the CUDA module each record the operations they ran (each
    # links its own copy of the MPI layer): merged, in start order.
    modules = [m for m in (_ext.cpu_module, _ext.cuda_module)
               if m is not None and hasattr(m, "nonblocking_timeline")]
    out = [TimelineRecord(*rec[:3], *(t * 1e-9 for t in rec[3:]))
           for m in modules for rec in m.nonblocking_timeline(bool(clear))]
    return sorted(out, key=lambda r: r.start)
