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

__all__ = ["SyncStats", "STATS_FIELDS", "stats_dtype", "last_stats", "add_traffic",
           "saturating_add", "saturating_sum"]

STATS_FIELDS = ("bytes_sent", "bytes_received", "messages", "result_nnz", "switched_to_dense",
                "algorithm")


#: the fields that add up when one step runs several exchanges
TRAFFIC_FIELDS = ("bytes_sent", "bytes_received", "messages")


def saturating_add(a: jax.Array, b: jax.Array) -> jax.Array:
    """``a + b`` for counters, saturating at the dtype's largest value instead of wrapping.

    The C++ side counts in int64 and saturates when it writes int32 (JAX without
    x64); a sum of two such counters in int32 would wrap to a negative count, so
    every sum of counters goes through here. ``b <= 0`` (an algorithm id of -1)
    adds as usual.
    """
    b = jnp.asarray(b).astype(jnp.result_type(a))
    top = jnp.iinfo(jnp.result_type(a)).max
    return jnp.where((b > 0) & (a > top - b), top, a + b)


def saturating_sum(x: jax.Array, axis: int = 0) -> jax.Array:
    """``x.sum(axis)`` of counters with :func:`saturating_add` (no wrap-around)."""
    x = jnp.moveaxis(jnp.asarray(x), axis, 0)
    total = x[0]
    for i in range(1, x.shape[0]):
        total = saturating_add(total, x[i])
    return total


def add_traffic(stats: jax.Array, other: jax.Array) -> jax.Array:
    """``stats`` (a raw stats vector) with ``other``'s bytes and messages added
    (saturating, see :func:`saturating_add`).

    For a step that runs two exchanges: the other fields (result nnz, the
    algorithm) stay ``stats``'s.
    """
    fields = jnp.array([STATS_FIELDS.index(f) for f in TRAFFIC_FIELDS])
    return stats.at[fields].set(saturating_add(stats[fields], other[fields]))


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


def last_stats(opt_state) -> jax.Array:
    """The last step's wire statistics of every sync in an optimizer state, as one vector.

    Finds each state with a ``last_stats`` vector (the syncs' states, and
    ``AdamDirectionSyncState``, which reads its sync's) anywhere in ``opt_state``
    (``optax.chain`` tuples, ``optax.partition``'s dicts, any NamedTuple or list
    around them). One sync: its own vector. Several (e.g. small leaves synced
    densely through ``optax.partition``, the rest sparsely): the vector of the
    one that sent the most bytes, with ``bytes_sent``, ``bytes_received`` and
    ``messages`` summed over all of them. Works inside ``jax.jit``.

    Raises:
      ValueError: no sync state in ``opt_state``.

    Example:
      >>> import jax.numpy as jnp, optax, jax_sparse_sync as jss
      >>> tx = optax.chain(optax.clip_by_global_norm(1.0), jss.topk_sync(k=1),
      ...                  optax.sgd(0.1))
      >>> state = tx.init({"w": jnp.zeros(3)})
      >>> jss.SyncStats.from_vector(jss.last_stats(state)).as_dict()["bytes_sent"]
      0
    """
    found = []

    def walk(x):
        if hasattr(x, "last_stats"):
            found.append(x.last_stats)
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, (tuple, list)):
            for v in x:
                walk(v)

    walk(opt_state)
    if not found:
        raise ValueError("jax_sparse_sync.last_stats: no sync state (one with `last_stats`, "
                         "e.g. a jss.topk_sync's) in `opt_state`; pass the state of an "
                         "optimizer that contains a sync")
    if len(found) == 1:
        return found[0]
    summed = jnp.array([STATS_FIELDS.index(f) for f in ("bytes_sent", "bytes_received",
                                                        "messages")])
    stacked = jnp.stack(found)
    main = stacked[jnp.argmax(stacked[:, STATS_FIELDS.index("bytes_sent")])]
    return main.at[summed].set(saturating_sum(stacked[:, summed], axis=0))
