"""``jss.axis(name)``: a named mesh axis used as a communicator.

The JAX-collective transport's communicator. It is a plain frozen dataclass
with no dependency on the rest of the package, so the MPI plumbing and the
transport dispatch (:mod:`jax_sparse_sync.ops.transport`) can recognise it.
"""

from __future__ import annotations

import dataclasses
from typing import Hashable

import jax

__all__ = ["AxisComm", "axis"]


@dataclasses.dataclass(frozen=True)
class AxisComm:
    """A named mesh axis used as a communicator (see :func:`axis`).

    Hashable and immutable, so it can be closed over by jitted functions.
    ``P`` is only known inside a trace that binds the axis (``shard_map`` /
    ``pmap``): :meth:`size` reads it there.
    """

    name: Hashable

    def size(self, op: str = "sparse_allreduce") -> int:
        """Number of devices P along the axis; only inside shard_map/pmap over it."""
        try:
            return int(jax.lax.axis_size(self.name))
        except NameError:
            raise NameError(
                f"jax_sparse_sync.{op}: `comm` is {self!r}, but no mesh axis named "
                f"{self.name!r} is bound here. Call it inside jax.shard_map(..., mesh=mesh) over "
                f"a mesh with that axis (or jax.pmap(..., axis_name={self.name!r})); outside a "
                "mapped context use comm=None (MPI)."
            ) from None

    def rank(self) -> jax.Array:
        """This device's index along the axis (traced)."""
        return jax.lax.axis_index(self.name)

    def __getattr__(self, attr: str):
        # mpi4py methods (Get_size, Dup, py2f, ...) reach here: code written for MPI
        # communicators (non-blocking calls, calibrate) says why it cannot take a mesh axis.
        if attr[:1].isupper() or attr == "py2f":
            raise AttributeError(
                f"jax_sparse_sync: {self!r} is a JAX mesh axis, not an mpi4py communicator, so "
                f"it has no `{attr}`. Non-blocking calls (sparse_allreduce_start/done) and "
                "calibrate() need an MPI communicator; under shard_map/pmap use "
                "jss.sparse_allreduce / oktopk_allreduce / block_allreduce / dense_allreduce and "
                "topk_sync / "
                "oktopk_sync / block_sync / dense_sync (XLA schedules and overlaps collectives "
                "itself).")
        raise AttributeError(attr)

    def __repr__(self) -> str:
        return f"jss.axis({self.name!r})"


def axis(name) -> AxisComm:
    """The mesh axis ``name`` as a communicator: ``comm=jss.axis("data")``.

    Use it inside ``jax.shard_map`` (or ``jax.pmap(..., axis_name=name)``);
    :func:`sparse_allreduce`, :func:`oktopk_allreduce`, :func:`block_allreduce`,
    :func:`dense_allreduce`, :func:`topk_sync`, :func:`oktopk_sync`, :func:`block_sync` and
    :func:`dense_sync` then run their algorithms with JAX collectives over
    that axis (see :mod:`jax_sparse_sync.mesh.sparse_allreduce` for how each maps to collectives).

    Args:
      name: a mesh axis name (str), or a tuple of them for several axes at
        once (devices are numbered in mesh order).

    Example:
      >>> import jax_sparse_sync as jss
      >>> jss.axis("data")
      jss.axis('data')
    """
    ok = isinstance(name, str) and name or (
        isinstance(name, tuple) and name and all(isinstance(n, str) and n for n in name))
    if not ok:
        raise TypeError(f"jax_sparse_sync.axis: `name` must be a mesh axis name (a non-empty str) "
                        f"or a tuple of them; got {name!r}")
    return AxisComm(name)
