"""The Adam kernels (``jss_adam_direction``, ``jss_adam_accumulate``) as JAX functions.

Thin bindings, per device: :mod:`jax_sparse_sync.transforms.adam_pass` and
:mod:`jax_sparse_sync.transforms.adam_accumulate` lay out the operands and run
these kernels on CPU (one pass over the N floats on all cores, the state updated
in place) and on GPU arrays where the CUDA module is built (the same bits), and
the ``jax.numpy`` twins here elsewhere (XLA fuses the elementwise arithmetic). The
twins are the kernels' reference: the same arithmetic, entry by entry
(``tests/test_adam_direction_pass.py``, ``tests/test_adam_accumulate.py``). C++:
``kernels/adam_direction.h``, ``kernels/adam_accumulate.h``; CUDA:
``kernels/fused_accumulate.cuh``.

The state's layout (the kernels' contract): ``mu`` and ``nu`` flat (N,) float32,
``age`` flat (N,) int16 saturating at :data:`MAX_AGE`, stored negative where the
sync's residual held something before this step's sync; at the next step a
coordinate with a negative age and a zero residual (:func:`pending_mask`) was
sent after being held back, and its first moment (and age) start again before
the new gradient is added: DGC's momentum masking, applied lazily.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from jax_sparse_sync import _ext  # noqa: F401  (registers the FFI targets)
from jax_sparse_sync.base.leaf_layout import placed

__all__ = ["MASKING_IDS", "MAX_AGE", "AGE_DTYPE", "bias1_table", "pending_mask", "next_age",
           "adam_direction_kernel", "mean_moment_kernel", "adam_direction_twin",
           "mean_moment_twin", "adam_accumulate_kernel"]

#: momentum masking -> the kernel's id (kernels/adam_direction.h, MomentumMasking)
MASKING_IDS = {"restart": 0, "zero": 1, "off": 2}

#: The largest age: ages are int16 and saturate there (kernels/adam_direction.h,
#: kMaxAge).
MAX_AGE = 32767

#: ``age``'s dtype in :class:`~jax_sparse_sync.AdamDirectionSyncState`.
AGE_DTYPE = jnp.int16


def bias1_table(b1: float) -> jax.Array:
    """``1 - b1**a`` for ``a = 1 .. T``, where ``T`` is the first age at which it is
    1.0 in float32 (``b1**T < 2**-25``), at most :data:`MAX_AGE` entries."""
    if b1 <= 0.0:
        size = 1
    else:
        size = min(MAX_AGE, max(1, math.ceil(25 * math.log(2) / -math.log(b1)) + 1))
    ages = jnp.arange(1, size + 1, dtype=jnp.float32)
    return 1.0 - jnp.float32(b1) ** ages


def next_age(age: jax.Array) -> jax.Array:
    """``|age| + 1`` saturated at :data:`MAX_AGE`, as int32 (the kernel's rule)."""
    return jnp.minimum(jnp.abs(age.astype(jnp.int32)), MAX_AGE - 1) + 1


def pending_mask(age: jax.Array, residual: jax.Array) -> jax.Array:
    """Where a mask is pending: held back before the last sync (age < 0), sent by it."""
    return (age < 0) & (residual == 0)


def _adam_constants(b1, b2, eps, masking) -> dict:
    """The kernels' Adam attributes."""
    return dict(b1=np.float32(b1), one_minus_b1=np.float32(1.0 - b1), b2=np.float32(b2),
                one_minus_b2=np.float32(1.0 - b2), eps=np.float32(eps),
                masking=np.int64(MASKING_IDS[masking]))


def adam_direction_kernel(leaves, mu, nu, age, residual, bias2, bias1_t, scale, *, b1, b2, eps,
                          masking, noise=None, noise_scalars=None):
    """``jss_adam_direction``: one Adam step of this rank's gradient, in one pass.

    Args:
      leaves: the gradient's leaves, raveled float32, in the flat layout's order.
      mu, nu, age: the flat (N,) state (updated in place: aliased to the outputs).
      residual: the sync's flat (N,) float32 residual before this step (the
        pending masks), or ``None`` (no masking).
      bias2, bias1_t, scale: float32 scalars: ``1 - b2**t``, ``1 - b1**t`` and
        the direction's factor.
      b1, b2, eps, masking: Adam's constants and the momentum masking.
      noise, noise_scalars: ``second_moment="mean"``'s three (N,) buffers and
        its step scalars ``(noise_norm, update_noise, keep, floor)``; both
        ``None`` for the plain pass.

    Returns:
      ``(mu, nu, age, direction)``, or with ``noise`` ``(mu, nu, noise, age,
      direction)``.
    """
    n = mu.shape[0]
    has_noise = noise is not None
    f32 = jax.ShapeDtypeStruct((n,), jnp.float32)
    ages = jax.ShapeDtypeStruct((n,), AGE_DTYPE)
    noise_buf = jax.ShapeDtypeStruct((n if has_noise else 1,), jnp.float32)
    call = jax.ffi.ffi_call("jss_adam_direction",
                            (f32, f32, ages, noise_buf, noise_buf, noise_buf, f32),
                            input_output_aliases={i: i for i in range(6)},
                            vmap_method="sequential")
    if not has_noise:  # unread; separate buffers: each is aliased to an output
        noise = tuple(jnp.zeros((1,), jnp.float32) for _ in range(3))
        noise_scalars = (0.0, 0.0, 0.0, 1.0)
    scalars = jnp.stack([bias2, bias1_t, scale, *(jnp.asarray(x, jnp.float32)
                                                  for x in noise_scalars)]).astype(jnp.float32)
    has_residual = residual is not None
    if not has_residual:  # not read; and not mu, which is aliased to an output
        residual = jnp.zeros((1,), jnp.float32)
    mu, nu, age, d, last, before, direction = call(
        mu, nu, age, *noise, residual, bias1_table(b1), scalars, *leaves,
        **_adam_constants(b1, b2, eps, masking),
        has_residual=np.int64(has_residual), has_noise=np.int64(has_noise))
    if has_noise:
        return mu, nu, (d, last, before), age, direction
    return mu, nu, age, direction


def mean_moment_kernel(leaves, mu, nu, age, residual, bias2, bias1_t, scale, noise, scalars,
                       **consts):
    """:func:`adam_direction_kernel` with the mean gradient's second moment estimated
    (``noise`` and its step ``scalars``): :func:`mean_moment_twin`'s signature."""
    return adam_direction_kernel(leaves, mu, nu, age, residual, bias2, bias1_t, scale,
                                 noise=noise, noise_scalars=scalars, **consts)


def adam_direction_twin(leaves, mu, nu, age, residual, bias2, bias1_t, scale, *, b1, b2, eps,
                        masking, second_moment=None):
    """:func:`adam_direction_kernel` (the plain pass) in ``jax.numpy``: ``(mu, nu,
    age, direction)``. ``second_moment``: ``nu_hat ->`` what the direction divides
    by the square root of (``None``: ``nu_hat``)."""
    g = leaves[0] if len(leaves) == 1 else jnp.concatenate(leaves)
    if residual is not None:
        sent = pending_mask(age, residual)
        mu = jnp.where(sent, 0.0, mu)
        age = jnp.where(sent, jnp.zeros_like(age), age)
    a = next_age(age)
    mu = jnp.float32(b1) * mu + jnp.float32(1.0 - b1) * g
    nu = jnp.float32(b2) * nu + jnp.float32(1.0 - b2) * g * g
    bias1 = 1.0 - jnp.float32(b1) ** a.astype(jnp.float32) if masking == "restart" else bias1_t
    v = nu / bias2 if second_moment is None else second_moment(nu / bias2)
    direction = scale * ((mu / bias1) / (jnp.sqrt(v) + jnp.float32(eps)))
    if residual is not None:
        a = jnp.where(residual != 0, -a, a)
    return mu, nu, a.astype(AGE_DTYPE), direction


def mean_moment_twin(leaves, mu, nu, age, residual, bias2, bias1_t, scale, noise, scalars, *,
                     b1, b2, eps, masking):
    """:func:`mean_moment_kernel` in ``jax.numpy``: ``(mu, nu, noise, age, direction)``,
    ``noise`` the new ``(diff_sq, last, before_last)``."""
    diff_sq, last, before_last = noise
    norm, update, keep, floor = scalars
    g = leaves[0] if len(leaves) == 1 else jnp.concatenate(leaves)
    diff = g - 2.0 * last + before_last
    b2f = jnp.float32(b2)
    diff_sq = jnp.where(update > 0, b2f * diff_sq + jnp.float32(1.0 - b2) * diff * diff,
                        diff_sq)
    sigma2 = diff_sq * norm

    def mean_gradients(nu_hat):
        return jnp.maximum(nu_hat - keep * sigma2, nu_hat * floor)
    mu, nu, age, direction = adam_direction_twin(leaves, mu, nu, age, residual, bias2, bias1_t,
                                                 scale, b1=b1, b2=b2, eps=eps, masking=masking,
                                                 second_moment=mean_gradients)
    return mu, nu, (diff_sq, g, last), age, direction


def adam_accumulate_kernel(leaves, mu, nu, age, noise, residual, scalars, *, b1, b2, eps,
                           masking, mask, has_noise, has_decay, k, cap, starts=None,
                           has_clip=False):
    """``jss_adam_accumulate``: the Adam pass written into the sync's accumulator.

    One pass reads the gradient's leaves, ``mu``, ``nu``, ``age`` (and ``noise``)
    and the residual, and writes them and ``acc = decay * residual + direction``
    in place (into the residual's buffer), with the exact top-k of ``acc``
    listed from its blocks while they are in cache when ``k`` > 0.

    Args:
      leaves: the gradient's (or a part's) leaves, raveled float32.
      mu, nu, age, residual: the flat (N,) state and residual (aliased to the
        outputs); ``noise``: ``second_moment="mean"``'s three (N,) buffers, or None.
      scalars: (11,) float32: ``1 - b2**t``, ``1 - b1**t``, the direction's
        factor, the noise's four step scalars, the decay, the list's hint, the
        gradient's global norm and ``max_norm``.
      b1, b2, eps, masking: Adam's constants and the momentum masking.
      mask: whether the residual holds the pending masks.
      has_noise, has_decay, has_clip: which of the optional parts run.
      k, cap: the top-k's size (0: none) and the hint list's room.
      starts: each leaf's first entry in the (N,) buffers (None: one after the
        other from 0).

    Returns:
      ``(mu, nu, age, noise, acc, values, indices, hint_used)`` (``noise`` None
      without it; ``values`` and ``indices`` of length ``max(k, 1)``).
    """
    n = mu.shape[0]
    starts, gathered = placed(leaves, starts)
    f32 = jax.ShapeDtypeStruct((n,), jnp.float32)
    noise_buf = jax.ShapeDtypeStruct((n if has_noise else 1,), jnp.float32)
    out_k = max(k, 1)
    call = jax.ffi.ffi_call(
        "jss_adam_accumulate",
        (f32, f32, jax.ShapeDtypeStruct((n,), AGE_DTYPE), noise_buf, noise_buf, noise_buf, f32,
         jax.ShapeDtypeStruct((out_k,), jnp.float32), jax.ShapeDtypeStruct((out_k,), jnp.int32),
         jax.ShapeDtypeStruct((1,), jnp.int32), jax.ShapeDtypeStruct((gathered,), jnp.float32)),
        input_output_aliases={i: i for i in range(7)}, vmap_method="sequential")
    if not has_noise:  # unread; separate buffers: each is aliased to an output
        noise = tuple(jnp.zeros((1,), jnp.float32) for _ in range(3))
    mu, nu, age, d, last, before, acc, values, indices, used, _ = call(
        mu, nu, age, *noise, residual, bias1_table(b1), scalars, *leaves,
        **_adam_constants(b1, b2, eps, masking), mask_from_residual=np.int64(mask),
        has_noise=np.int64(has_noise), has_decay=np.int64(has_decay),
        has_clip=np.int64(has_clip), k=np.int64(k),
        cap=np.int64(cap), starts=np.asarray(starts, dtype=np.int64))
    noise = (d, last, before) if has_noise else None
    return mu, nu, age, noise, acc, values, indices, used[0]
