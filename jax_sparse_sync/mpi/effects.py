"""The ordered effect carried by every MPI custom call.

``has_side_effect=True`` alone only stops dead-code elimination; XLA may still
reorder two collectives differently on different ranks, and then the ranks
deadlock. Giving each MPI call this *ordered* effect makes JAX thread a token
through them, in program order, inside and across jitted computations.
"""

from __future__ import annotations

from jax._src import effects as _effects

try:  # jax >= 0.11 re-exports it publicly
    from jax.ffi import abstract_token  # type: ignore[attr-defined]
except ImportError:  # jax 0.10: the private singleton (identity is checked)
    from jax._src.core import abstract_token  # noqa: F401


class MPIOrderedEffect(_effects.Effect):
    """Marks a primitive that communicates over MPI."""

    __str__ = lambda self: "jax_sparse_sync.MPI"  # noqa: E731


_effects.lowerable_effects.add_type(MPIOrderedEffect)
_effects.ordered_effects.add_type(MPIOrderedEffect)
_effects.control_flow_allowed_effects.add_type(MPIOrderedEffect)
_effects.custom_derivatives_allowed_effects.add_type(MPIOrderedEffect)

mpi_effect = MPIOrderedEffect()


def reset_after_mpi_error() -> None:
    """Lets MPI calls run again after one of them raised an error you caught.

    Every MPI call takes JAX's runtime token for the MPI effect and returns the
    next one. On GPU, XLA marks the token returned by a call that failed (a NaN
    under ``nan_policy="raise"``, sizes that differ across ranks) as failed too,
    and the next MPI call would fail with the same error. This waits for the
    MPI calls still in flight, forgets their errors (they have reached you
    already) and starts a fresh token.

    If an MPI call itself failed (an error naming an MPI function) on any rank,
    it also moves the library's communicators to fresh duplicates: messages a
    peer had already sent for the failed call cannot be cancelled and would
    otherwise reach the next call on the same communicator (a wrong sum). It is
    collective: call it on every rank after catching the error, before the
    next MPI call (a rank that did not raise cannot go on anyway). Its
    collectives are non-blocking and posted for every communicator at once, so
    the ranks may have handed their communicators to the library in different
    orders. Details: docs/semantics.md.

    Example:
      >>> import jax.numpy as jnp, numpy as np, jax_sparse_sync as jss
      >>> try:
      ...     jss.sparse_allreduce(jnp.array([np.nan]), jnp.array([0], jnp.int32), size=4
      ...                          ).block_until_ready()
      ... except Exception as e:
      ...     print("caught:", "non-finite" in str(e))
      ...     jss.mpi.reset_after_mpi_error()
      caught: True
      >>> jss.sparse_allreduce(jnp.ones(2), jnp.arange(2, dtype=jnp.int32), size=4).tolist()
      [1.0, 1.0, 0.0, 0.0]
    """
    from jax._src import dispatch

    tokens = dispatch.runtime_tokens
    failed = []
    for key, token in list(tokens.current_tokens.items()) + list(tokens.output_runtime_tokens.items()):
        try:
            token.block_until_ready()
        except Exception:  # noqa: BLE001 - the failed call's error, already raised to the caller
            failed.append(key)
    for key in failed:
        tokens.current_tokens.pop(key, None)
        tokens.output_runtime_tokens.pop(key, None)
    from jax_sparse_sync.mpi.comm import renew_after_mpi_error

    renew_after_mpi_error()
