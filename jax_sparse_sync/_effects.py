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
