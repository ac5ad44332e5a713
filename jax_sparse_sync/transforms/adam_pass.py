"""The Adam pass of :func:`~jax_sparse_sync.adam_direction_sync`: moments, age, direction.

One step of Adam over this rank's own gradient, with DGC's momentum masking
applied lazily (see ``kernels/adam_direction.h``): ``age`` is stored negative
where the sync's residual held something before this step's sync; at the next
step, a coordinate with a negative age and a zero residual was sent after being
held back, and its first moment (and age) start again before the new gradient
is added. The arithmetic is that of masking right after the sync.

On CPU this is one FFI call (``jss_adam_direction``: one pass over the N floats
on all cores, the moments updated in place, the gradient read from its leaves'
own buffers), and on GPU arrays the same call where the CUDA module is built (its
CUDA twin, ``kernels/fused_accumulate.cuh``: the CPU kernel's bits); elsewhere
the same arithmetic in ``jax.numpy`` (XLA fuses it well). Both live in
:mod:`jax_sparse_sync.bindings.adam` (with the age layout's constants,
re-exported here) and are checked against each other in
``tests/test_adam_direction_pass.py``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import optax

from jax_sparse_sync._ext import kernel_platforms
from jax_sparse_sync.base.jax_compat import varying_as_inputs
from jax_sparse_sync.bindings.adam import (AGE_DTYPE, MASKING_IDS, MAX_AGE, adam_direction_kernel,
                                           adam_direction_twin, bias1_table, mean_moment_kernel,
                                           mean_moment_twin, next_age, pending_mask)

__all__ = ["adam_direction_pass", "mean_moment_pass", "pending_mask", "bias1_table",
           "as_ages", "next_age", "global_norm", "clip_leaves", "MAX_AGE", "AGE_DTYPE",
           "MASKING_IDS", "MAX_RESTART_B1", "mean_moment_scalars"]

#: The largest ``b1`` momentum masking "restart" accepts with int16 ages: the bias
#: correction stays exact where ``1 - b1**MAX_AGE`` rounds to 1.0 in float32
#: (``b1**MAX_AGE < 2**-26``: every saturated age has the correction 1.0, with
#: a factor of two to spare for float32's rounding of ``b1`` and of the power).
MAX_RESTART_B1 = math.exp(-26 * math.log(2) / MAX_AGE)


def as_ages(age) -> jax.Array:
    """``age`` as the state's int16 ages: float ages (a state saved before they were
    int16) rounded and saturated at :data:`MAX_AGE`; int16 ages as they are."""
    age = jnp.asarray(age)
    if age.dtype == AGE_DTYPE:
        return age
    return jnp.clip(jnp.round(age), -MAX_AGE, MAX_AGE).astype(AGE_DTYPE)


def global_norm(grads) -> jax.Array:
    """The gradient's global L2 norm, as ``optax.clip_by_global_norm`` computes it
    (``optax.tree.norm`` where it exists): the folded clip is optax's bit for bit
    where both use the same norm, as with the pinned optax (constraints.txt)."""
    norm = getattr(getattr(optax, "tree", None), "norm", None)  # optax >= 0.2.5
    return (norm or optax.tree_utils.tree_l2_norm)(grads)


def clip_leaves(grads, norm, max_norm):
    """``grads`` clipped as ``optax.clip_by_global_norm(max_norm)`` clips it, given its
    global ``norm`` (:func:`global_norm`): the same operations (a division by the
    norm, then a product), so the same bits. The fused CPU pass
    (``kernels/adam_direction.h``, ``clip``) rounds each entry the same way."""
    trigger = jnp.squeeze(norm < max_norm)
    return jax.tree_util.tree_map(
        lambda t: jax.lax.select(trigger, t, (t / norm.astype(t.dtype)) * max_norm), grads)


def adam_direction_pass(grads, mu, nu, age, residual, count, *, b1: float, b2: float,
                        eps: float, masking: str, scale=None):
    """One Adam step of this rank's gradient; returns ``(mu, nu, age, direction)``.

    Args:
      grads: the gradient, a tree (its leaves in ``jax.tree_util`` order are the
        flat layout of ``mu``).
      mu, nu: flat (N,) float32 state.
      age: flat (N,) int16, signed as described above, saturating at
        :data:`MAX_AGE`.
      residual: the sync's flat (N,) residual before this step, or ``None`` (no
        masking: the sync has none, or ``masking="off"``).
      count: this step's number (int32 scalar, from 1).
      b1, b2, eps: Adam's constants.
      masking: ``"restart"``, ``"zero"`` or ``"off"``.
      scale: a float32 scalar the direction is multiplied by (a learning rate
        applied before the sync), or ``None`` (1).

    Returns:
      The new ``mu``, ``nu``, ``age`` and the bias-corrected direction (times
      ``scale``), all (N,), ``age`` int16 and the rest float32.
    """
    leaves = [jnp.ravel(x).astype(jnp.float32) for x in jax.tree_util.tree_leaves(grads)]
    t = jnp.asarray(count).astype(jnp.float32)
    bias2 = 1.0 - jnp.float32(b2) ** t
    bias1_t = 1.0 - jnp.float32(b1) ** t
    if masking == "off":
        residual = None
    scale = jnp.float32(1.0) if scale is None else jnp.asarray(scale, jnp.float32)
    args = (leaves, mu, nu, as_ages(age), residual, bias2, bias1_t, scale)
    consts = dict(b1=b1, b2=b2, eps=eps, masking=masking)
    kernel = varying_as_inputs(adam_direction_kernel, **consts)
    return jax.lax.platform_dependent(
        *args, **{platform: kernel for platform in kernel_platforms("jss_adam_direction")},
        default=varying_as_inputs(adam_direction_twin, **consts))


def mean_moment_pass(grads, mu, nu, noise, age, residual, count, *, b1: float, b2: float,
                     eps: float, masking: str, scale=None, nranks: int, warmup: int = 0):
    """:func:`adam_direction_pass` with the mean gradient's second moment estimated.

    Each rank's ``nu`` holds its own gradient's second moment, ``E[g_r^2] = mu^2 +
    sigma^2`` (``sigma^2``: one rank's batch noise), where dense Adam's holds the
    mean gradient's, ``mu^2 + sigma^2 / P``. Where the noise dominates (late in
    training), ``mean_r(m_r / sqrt(nu_r))`` is then dense Adam's direction shrunk
    by up to ``sqrt(P)``. This pass also tracks the second moment of the
    gradient's second difference, ``E[(g_t - 2 g_{t-1} + g_{t-2})^2] = 6 sigma^2``
    (the batches are independent; the mean gradient's drift cancels where it is
    linear over three steps), and divides by ``sqrt(v)`` with ``v = nu_hat -
    (1 - 1/P) sigma_hat^2``, at least ``nu_hat / P``: the mean gradient's second
    moment, estimated from this rank's gradients alone (no communication).

    Why the second difference: the first one, ``E[(g_t - g_{t-1})^2] = 2 sigma^2
    + drift^2``, counts the mean's change between steps as noise, and makes the
    step too large. Measurements: benchmarks/README.md, "second_moment_bias.py".

    Args:
      noise: ``(d, last, before_last)``: the EMA of the squared second difference,
        the last gradient and the one before, flat (N,) float32 each (zeros at
        first).
      nranks: P, the ranks whose directions the sync averages.
      warmup: steps W over which the correction grows: ``v = max(nu_hat - c
        sigma_hat^2, (1 - c) nu_hat)`` with ``c = min(1, t / W) (1 - 1/P)``
        (0: ``c = 1 - 1/P`` from the start).
      (others as :func:`adam_direction_pass`)

    Returns:
      ``(mu, nu, noise, age, direction)``.

    On CPU the same one-pass kernel as :func:`adam_direction_pass` (its noise
    variant); elsewhere ``jax.numpy``.
    """
    leaves = [jnp.ravel(x).astype(jnp.float32) for x in jax.tree_util.tree_leaves(grads)]
    t = jnp.asarray(count).astype(jnp.float32)
    b2f = jnp.float32(b2)
    scalars = mean_moment_scalars(count, b2=b2, nranks=nranks, warmup=warmup)
    scale = jnp.float32(1.0) if scale is None else jnp.asarray(scale, jnp.float32)
    args = (leaves, mu, nu, as_ages(age), None if masking == "off" else residual,
            1.0 - b2f ** t, 1.0 - jnp.float32(b1) ** t, scale, tuple(noise), scalars)
    consts = dict(b1=b1, b2=b2, eps=eps, masking=masking)
    kernel = varying_as_inputs(mean_moment_kernel, **consts)
    return jax.lax.platform_dependent(
        *args, **{platform: kernel for platform in kernel_platforms("jss_adam_direction")},
        default=varying_as_inputs(mean_moment_twin, **consts))


def mean_moment_scalars(count, *, b2: float, nranks: int, warmup: int = 0):
    """:func:`mean_moment_pass`'s step scalars ``(noise_norm, update_noise, keep,
    floor)`` at step ``count`` (see kernels/adam_direction.h)."""
    t = jnp.asarray(count).astype(jnp.float32)
    b2f = jnp.float32(b2)
    p = jnp.float32(nranks)
    # second differences from step 3 on: their EMA is bias-corrected over t - 2 samples
    update = t > 2.0
    norm = jnp.where(update, 1.0 / (6.0 * jnp.maximum(1.0 - b2f ** (t - 2.0),
                                                      jnp.float32(1e-30))), 0.0)
    keep = 1.0 - 1.0 / p
    if warmup:
        keep = keep * jnp.minimum(t / jnp.float32(warmup), 1.0)
    return (norm, update.astype(jnp.float32), keep, 1.0 - keep)
