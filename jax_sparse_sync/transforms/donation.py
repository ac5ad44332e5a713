"""``jss.check_donation``: tells (once) when a jitted step copies the syncs' state every step.

The sparse syncs keep an N-float error-feedback residual (``topk_sync``,
``oktopk_sync``) and ``adam_direction_sync`` its N-float moments; each step
updates them in place (``input_output_aliases`` of the FFI kernels). That only
holds when the jitted step donates the optimizer state: under a plain
``jax.jit`` the state is still the caller's, so XLA copies every such buffer
before the kernels write into it, one extra read and write of N floats per
buffer and step. Nothing fails and the numbers are the same, so the cost goes
unnoticed. Measurements: docs/topics/dense_sync.md.

The check reads JAX's own record of which arguments a lowered step donates
(``jax.stages.Lowered.args_info``): it lowers the step (no compilation, no
execution) and compares.
"""

from __future__ import annotations

import warnings

import jax
import numpy as np

from jax_sparse_sync.transforms.adam_direction_sync import AdamDirectionSyncState
from jax_sparse_sync.transforms.oktopk_sync import OktopkSyncState
from jax_sparse_sync.transforms.topk_sync import TopkSyncState

__all__ = ["check_donation", "NotDonatedWarning"]

#: the states whose large buffers a step updates in place
STATE_TYPES = (TopkSyncState, OktopkSyncState, AdamDirectionSyncState)
#: buffers smaller than this are not worth a warning (a copy costs microseconds)
MIN_BYTES = 1 << 20

_reported: set[str] = set()


class NotDonatedWarning(UserWarning):
    """A jitted step copies a sync's state every step because it does not donate it."""


def check_donation(step, *args, min_bytes: int = MIN_BYTES, **kwargs) -> list[str]:
    """Which large sync-state buffers ``step`` does not donate; warns once about them.

    Call it once with the step's first arguments, before the loop (it lowers
    the step, which costs one trace, and runs nothing). Each buffer of at least
    ``min_bytes`` inside a ``TopkSyncState``, ``OktopkSyncState`` or
    ``AdamDirectionSyncState`` among the arguments that the step does not
    donate is copied by XLA on every call; the first time a buffer is found a
    :class:`NotDonatedWarning` says so, with the fix.

    Args:
      step: a ``jax.jit``-ed function (anything with ``.lower``, e.g. a
        ``jax.jit(jax.shard_map(...))``).
      *args: the positional arguments of its first call (arrays or
        ``jax.ShapeDtypeStruct`` objects); static arguments are not supported.
      **kwargs: its keyword arguments, likewise.
      min_bytes: the smallest buffer reported.

    Returns:
      The not-donated buffers, as ``"TopkSyncState.residual (30.0 MB)"``;
      empty when the step donates them all (or holds no sync state).

    Raises:
      TypeError: ``step`` is not a jitted function.

    Example:
      >>> import jax, jax.numpy as jnp, optax, jax_sparse_sync as jss
      >>> tx = optax.chain(jss.topk_sync(k=10), optax.sgd(0.1))
      >>> params = {"w": jnp.zeros(1 << 18)}
      >>> def step(params, state, grads):
      ...     updates, state = tx.update(grads, state, params)
      ...     return optax.apply_updates(params, updates), state
      >>> good = jax.jit(step, donate_argnums=(0, 1))
      >>> jss.check_donation(good, params, tx.init(params), params)
      []
    """
    if not hasattr(step, "lower"):
        raise TypeError("jax_sparse_sync.check_donation: `step` must be a jitted function "
                        f"(jax.jit(...)), got {type(step).__name__}")
    infos = step.lower(*args, **kwargs).args_info
    is_state = lambda x: isinstance(x, STATE_TYPES)  # noqa: E731
    marks = jax.tree_util.tree_map(is_state, (args, kwargs), is_leaf=is_state)
    found: list[str] = []

    def visit(mark, state, info):
        if not mark:
            return
        for (path, leaf), arg in zip(jax.tree_util.tree_flatten_with_path(state)[0],
                                     jax.tree_util.tree_leaves(info)):
            nbytes = int(np.prod(np.shape(leaf))) * np.dtype(leaf.dtype).itemsize
            if nbytes >= min_bytes and not arg.donated:
                field = jax.tree_util.keystr(path, simple=True, separator=".")
                found.append(f"{type(state).__name__}.{field} ({nbytes / 1e6:.1f} MB)")

    jax.tree_util.tree_map(visit, marks, (args, kwargs), infos)
    new = [f for f in found if f not in _reported]
    if new:
        _reported.update(new)
        warnings.warn(
            "jax_sparse_sync: the jitted step does not donate " + ", ".join(new) + ": XLA "
            "copies each of these buffers on every call before the sync updates it in place. "
            "Donate the optimizer state, e.g. jax.jit(step, donate_argnums=(0, 1)) for "
            "step(params, opt_state, ...), and use the returned state (the donated one is "
            "deleted). See docs/topics/dense_sync.md for the measured cost.",
            NotDonatedWarning, stacklevel=2)
    return found
