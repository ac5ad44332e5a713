"""Wire statistics of a sparse allreduce, as counted by the C++ handlers.

Counting convention (bytes are payload bytes, headers of MPI itself excluded):
  * point-to-point messages (recursive doubling) are counted exactly, the
    count messages that precede each stream included;
  * an MPI collective we call is counted as the volume of its bandwidth-optimal
    schedule on the actual counts: an allgather(v) sends this rank's block to
    P-1 peers and receives everyone else's; MPI_Allreduce of N floats sends and
    receives 2 (P-1)/P N * 4 bytes (Rabenseifner);
  * the argument check every call begins with (an allgather of a 56-byte
    header) is included.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jax_sparse_sync import _ext

__all__ = ["SyncStats", "STATS_FIELDS", "stats_dtype"]

STATS_FIELDS = ("bytes_sent", "bytes_received", "messages", "result_nnz", "switched_to_dense",
                "algorithm")


def stats_dtype():
    """int64 with ``jax_enable_x64``, else int32 (the C++ side saturates it)."""
    return jnp.int64 if jax.config.jax_enable_x64 else jnp.int32


class SyncStats(NamedTuple):
    """Statistics of one sparse allreduce on this rank.

    int64 scalars with ``jax_enable_x64``; otherwise int32, saturating at 2**31 - 1.
    """

    bytes_sent: jax.Array
    bytes_received: jax.Array
    messages: jax.Array
    result_nnz: jax.Array
    switched_to_dense: jax.Array
    algorithm: jax.Array  # id of the algorithm that ran; see algorithm_name

    @property
    def algorithm_name(self) -> str:
        """Name of the algorithm that ran ("auto" resolved), e.g. ``"allgather"``."""
        names = {v: k for k, v in _ext.ALGORITHM_IDS.items()}
        return names.get(int(self.algorithm), "unknown")

    @classmethod
    def from_vector(cls, v: jax.Array) -> "SyncStats":
        """From the raw vector an Optax state keeps (``state.last_stats``)."""
        return cls(*(v[i] for i in range(len(STATS_FIELDS))))

    def as_dict(self) -> dict[str, int | str]:
        d = {f: int(getattr(self, f)) for f in STATS_FIELDS}
        d["algorithm"] = self.algorithm_name
        return d
