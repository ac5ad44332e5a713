"""The non-blocking sparse allreduce's two MPI primitives (``ffi/collectives/nonblocking_ffi.cc``).

``start`` returns an int32 handle of the collective running on a worker
thread; ``done`` waits for it and returns the sum and stats.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_sparse_sync.mpi.primitive import ordered_ffi_primitive
from jax_sparse_sync.stats import STATS_FIELDS, stats_dtype

__all__ = ["start_p", "done_p", "START_WAIT_PREVIOUS", "START_DEFER_CHECK", "START_WINDOW_SHIFT",
           "MAX_WINDOW"]

#: start's ``flags`` bits (ffi/collectives/collectives_host.h: kStartWaitPrevious, kStartDeferCheck,
#: the in-flight window in bits 8-15)
START_WAIT_PREVIOUS = 1
START_DEFER_CHECK = 2
START_WINDOW_SHIFT = 8
MAX_WINDOW = 255

start_p = ordered_ffi_primitive(
    "jss_sparse_allreduce_start", "jss_sparse_allreduce_start",
    lambda values, indices, seed, **_: (jax.core.ShapedArray((), jnp.int32),))

done_p = ordered_ffi_primitive(
    "jss_sparse_allreduce_done", "jss_sparse_allreduce_done",
    lambda handle, *, size: (jax.core.ShapedArray((size,), jnp.float32),
                             jax.core.ShapedArray((len(STATS_FIELDS),), stats_dtype())))
