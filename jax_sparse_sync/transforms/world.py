"""The world a sync state was written in: a per-rank state restored on another
number of ranks must be resharded first (:func:`jax_sparse_sync.reshard_state`).

On the MPI transport the error-feedback states record the communicator that
wrote them in a ``world`` field: an int32 vector of length P, 1 at this rank's
position and 0 elsewhere. Its length is the world size, known when a step is
traced (a shape, not a value), so a step on a communicator of another size
fails at trace time, naming the function to call, instead of silently
averaging by the wrong P; its position lets :func:`reshard_state` check that
the checkpoints it is given are in rank order. On a mesh axis it is ``None``
(the state there is one global array, sharded by the user), as it is in a
state saved before the field existed.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from jax_sparse_sync.ops import transport

__all__ = ["RESHARD_FUNCTION", "world_marker", "check_world", "check_oktopk_world"]

#: What the error message tells the user to call.
RESHARD_FUNCTION = "jax_sparse_sync.reshard_state"


def world_marker(comm):
    """``world`` for a fresh state on ``comm``: the one-hot of this rank among P
    (int32, shape (P,)); ``None`` on a mesh axis."""
    if transport.is_mesh_axis(comm):
        return None
    size, rank = comm.Get_size(), comm.Get_rank()
    return jnp.asarray(np.eye(size, dtype=np.int32)[rank])


def _mismatch(op: str, written: int, running: int) -> ValueError:
    return ValueError(
        f"jax_sparse_sync.{op}: this state was written by {written} ranks but the communicator "
        f"has {running}: a checkpoint of another world size must be resharded before it is "
        f"restored. Load every old rank's state (rank order) and call "
        f"`{RESHARD_FUNCTION}(states_by_old_rank, new_size={running})`, then give each rank its "
        f"entry (docs/topics/reliability.md, 'Restore at another world size').")


def check_world(world, comm, op: str) -> None:
    """Raises a ``ValueError`` naming :func:`reshard_state` when ``world`` (a
    state's field) was written on a communicator of another size than ``comm``."""
    if world is None or transport.is_mesh_axis(comm):
        return
    shape = getattr(world, "shape", None)
    if shape is None or len(shape) != 1:
        raise ValueError(f"jax_sparse_sync.{op}: the state's `world` must be an int32 vector "
                         f"(one entry per rank of the communicator that wrote it); got {world!r}")
    if shape[0] != comm.Get_size():
        raise _mismatch(op, shape[0], comm.Get_size())


def check_oktopk_world(boundaries, comm, op: str = "oktopk_sync") -> None:
    """Ok-Topk's state records P in its region boundaries (P + 1 of them)."""
    if transport.is_mesh_axis(comm):
        return
    written = int(np.shape(boundaries)[0]) - 1
    if written != comm.Get_size():
        raise _mismatch(op, written, comm.Get_size())
