"""The Adam-direction pass fused with the sync's accumulator: the flat entry point.

:func:`~jax_sparse_sync.adam_direction_sync` in front of a sync with a flat
float32 residual (``topk_sync``, ``oktopk_sync``, ``grouped_topk_sync``: a
:class:`~jax_sparse_sync.transforms.accumulator_source.FlatSyncTransformation`)
does not hand the sync its direction as a tree. It gives the sync an
:class:`~jax_sparse_sync.transforms.accumulator_source.AccumulatorSource`
whose producer runs one pass (``jss_adam_accumulate``,
``kernels/adam_accumulate.h``): it reads the gradient (its leaves' own
buffers), ``mu``, ``nu``, ``age`` and the residual, and writes ``mu``, ``nu``,
``age`` and ``acc = decay * residual + direction`` in place into the residual's
buffer, with the exact top-k of ``acc`` listed from its blocks while they are in
cache when the sync asks for one. The direction is never written, cut into
leaves or read back.

Unfused, the same step is :func:`~jax_sparse_sync.transforms.adam_pass.adam_direction_pass`
(writes the direction), ``split_like`` (XLA copies it into the gradient's
leaves) and the sync's ``accumulate_topk`` (reads the residual again and those
leaves). The arithmetic is the same entry by entry, so the accumulator, the
moments and therefore the whole step are the unfused step's bit for bit
(``tests/test_adam_accumulate.py``).

On CPU one FFI call (:func:`jax_sparse_sync.bindings.adam.adam_accumulate_kernel`),
and on GPU arrays the same call where the CUDA module is built (its CUDA twin,
``kernels/fused_accumulate.cuh``: the same bits as the CPU kernel); elsewhere the
same in ``jax.numpy`` (the unfused pass's twin, then the sum and ``jss.topk``;
XLA fuses the elementwise arithmetic, an FMA apart at most).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_sparse_sync._ext import kernel_platforms
from jax_sparse_sync.base.jax_compat import varying_as_inputs
from jax_sparse_sync.bindings.adam import (adam_accumulate_kernel, adam_direction_twin,
                                           mean_moment_twin)
from jax_sparse_sync.bindings.selection import topk
from jax_sparse_sync.transforms.accumulator_source import Accumulated, AccumulatorSource
from jax_sparse_sync.transforms.adam_pass import as_ages, clip_leaves, mean_moment_scalars
from jax_sparse_sync.transforms.flat import (HINT_CAPACITY, HINT_FACTOR, cut_at, leaf_starts,
                                             put_at)

__all__ = ["adam_accumulate", "adam_source"]


def adam_accumulate(grads, mu, nu, age, residual, count, *, b1: float, b2: float, eps: float,
                    masking: str, mask: bool = True, scale=None, decay=None, k=None,
                    last_kth=None, noise=None, nranks: int | None = None, warmup: int = 0,
                    at=None, clip=None):
    """One Adam step of this rank's gradient, added into the sync's accumulator.

    Args:
      grads: the gradient tree (float32 leaves; tree order is the flat layout).
      mu, nu, age: flat (N,) state (``age`` int16), as
        :func:`~jax_sparse_sync.transforms.adam_pass.adam_direction_pass`'s.
      residual: the sync's flat (N,) float32 residual before this step: the
        accumulator is written into its buffer (in place when donated) and, with
        ``mask``, the pending momentum masks are read from it.
      count: this step's number (int32 scalar, from 1).
      b1, b2, eps, masking: Adam's constants and the momentum masking.
      mask: whether the residual holds the masks (``False``: a residual the
        sync started this step with but that masks nothing, as a tree
        residual of an older version's state).
      scale: a float32 scalar the direction is multiplied by, or ``None`` (1).
      decay: the residual's decay this step (``acc = decay * residual +
        direction``), or ``None``.
      k: ``None``, or the entries of the exact top-k of ``|acc|`` to return.
      last_kth: the previous step's k-th magnitude (the list's hint), or ``None``.
      noise: with ``second_moment="mean"``, its three (N,) buffers (and then
        ``nranks`` and ``warmup`` as in
        :func:`~jax_sparse_sync.transforms.adam_pass.mean_moment_pass`);
        ``None`` for the plain pass.
      at: ``None``: ``grads`` is the whole gradient. Else ``grads`` is part of
        it (a group of :func:`~jax_sparse_sync.grouped_topk_sync`) and ``at``
        says where in the flat state: an int, the first entry of the range its
        leaves cover one after the other, or a sequence of ints, each leaf's
        first entry. ``mu``, ``nu``, ``age``, ``noise`` and ``residual`` are
        the whole (N,) buffers and only the part's entries are read and
        written, in place (the returned state and ``acc`` are whole, the rest
        as given); the top-k is over the part's entries in leaf order,
        ``indices`` relative to that order. The same bits as the call on the
        part's entries cut out and concatenated.
      clip: ``None``, or ``(norm, max_norm)``: the gradient's global norm
        (:func:`~jax_sparse_sync.transforms.adam_pass.global_norm` of the whole
        gradient, computed before this call) and a float; the pass then reads each
        gradient entry as ``optax.clip_by_global_norm(max_norm)`` leaves it (``(g /
        norm) * max_norm`` unless ``norm < max_norm``), the same bits, without the
        clipped gradient written and read back
        (:func:`~jax_sparse_sync.transforms.adam_pass.clip_leaves`).

    Returns:
      ``(mu, nu, age, noise, acc, values, indices, hint_used)``: ``values`` and
      int32 ``indices`` (ascending) the top-k (``None`` without ``k``),
      ``hint_used`` an int32 scalar (1 when the kernel selected from its list).
    """
    leaves = [jnp.ravel(x).astype(jnp.float32) for x in jax.tree_util.tree_leaves(grads)]
    t = jnp.asarray(count).astype(jnp.float32)
    if masking == "off":
        mask = False
    noise_scalars = None
    if noise is not None:
        noise_scalars = mean_moment_scalars(count, b2=b2, nranks=nranks, warmup=warmup)
    hint = (jnp.float32(0.0) if last_kth is None
            else jnp.asarray(last_kth, jnp.float32) * jnp.float32(HINT_FACTOR))
    scalars = (1.0 - jnp.float32(b2) ** t, 1.0 - jnp.float32(b1) ** t,
               jnp.float32(1.0) if scale is None else jnp.asarray(scale, jnp.float32),
               *(noise_scalars or (0.0, 0.0, 0.0, 1.0)),
               jnp.float32(1.0) if decay is None else jnp.asarray(decay, jnp.float32), hint,
               *((1.0, 1.0) if clip is None else clip))
    scalars = jnp.stack([jnp.asarray(x, jnp.float32) for x in scalars])
    n = sum(int(x.shape[0]) for x in leaves)  # the call's entries (all N without `at`)
    starts = leaf_starts(leaves, mu.shape[0], at, "jax_sparse_sync.adam_accumulate",
                         "the state's")
    consts = dict(b1=b1, b2=b2, eps=eps, masking=masking, mask=bool(mask),
                  has_noise=noise is not None, has_decay=decay is not None,
                  has_clip=clip is not None, k=0 if k is None else int(k),
                  cap=0 if k is None else int(min(n, HINT_CAPACITY * int(k))),
                  starts=starts)
    args = (leaves, mu, nu, as_ages(age), tuple(noise) if noise is not None else None,
            residual.astype(jnp.float32), scalars)
    kernel = varying_as_inputs(adam_accumulate_kernel, **consts)
    out = jax.lax.platform_dependent(
        *args, **{platform: kernel for platform in kernel_platforms("jss_adam_accumulate")},
        default=varying_as_inputs(_jnp_twin, **consts))
    mu, nu, age, noise_out, acc, values, indices, used = out
    if k is None:
        values = indices = None
    return mu, nu, age, noise_out if noise is not None else None, acc, values, indices, used


def _jnp_twin(leaves, mu, nu, age, noise, residual, scalars, *, b1, b2, eps, masking, mask,
              has_noise, has_decay, k, cap, starts=None, has_clip=False):
    # the unfused pass's jax.numpy twin, then the accumulator and jss.topk
    sizes = [int(x.shape[0]) for x in leaves]
    if starts is not None and sum(sizes) < mu.shape[0]:
        # a part of the state: the twin of its entries cut out (in leaf order), put
        # back into the whole buffers
        def cut(x):
            return cut_at(x, starts, sizes)

        def put(whole, piece):
            return put_at(whole, piece, starts, sizes)

        out = _jnp_twin(leaves, cut(mu), cut(nu), cut(age),
                        None if noise is None else tuple(cut(x) for x in noise),
                        cut(residual), scalars, b1=b1, b2=b2, eps=eps, masking=masking,
                        mask=mask, has_noise=has_noise, has_decay=has_decay, k=k, cap=cap,
                        has_clip=has_clip)
        mu_g, nu_g, age_g, noise_g, acc_g, values, indices, used = out
        return (put(mu, mu_g), put(nu, nu_g), put(age, age_g),
                None if noise is None else tuple(put(w, p) for w, p in zip(noise, noise_g)),
                put(residual, acc_g), values, indices, used)
    bias2, bias1_t, scale = scalars[0], scalars[1], scalars[2]
    if has_clip:
        leaves = clip_leaves(leaves, scalars[9], scalars[10])
    masks = residual if mask else None
    consts = dict(b1=b1, b2=b2, eps=eps, masking=masking)
    if has_noise:
        mu, nu, noise, age, direction = mean_moment_twin(leaves, mu, nu, age, masks, bias2,
                                                         bias1_t, scale, noise,
                                                         tuple(scalars[3:7]), **consts)
    else:
        mu, nu, age, direction = adam_direction_twin(leaves, mu, nu, age, masks, bias2, bias1_t,
                                                     scale, **consts)
    kept = residual * scalars[7] if has_decay else residual
    acc = kept + direction
    if k:
        values, indices = topk(acc, k)
    else:
        values, indices = jnp.zeros((1,), jnp.float32), jnp.full((1,), -1, jnp.int32)
    return mu, nu, age, noise, acc, values, indices, jnp.zeros((), jnp.int32)


def adam_source(*, b1: float, b2: float, eps: float, masking: str, mask: bool,
                nranks: int | None = None, warmup: int = 0) -> AccumulatorSource:
    """The :class:`~jax_sparse_sync.transforms.accumulator_source.AccumulatorSource`
    of :func:`~jax_sparse_sync.adam_direction_sync`: operands ``(grads, mu, nu, age,
    noise, count, scale, clip)`` (``clip``: ``None`` or the global norm and
    ``max_norm`` the pass clips the gradient by, :func:`adam_accumulate`); its
    ``extra`` is the new ``(mu, nu, age, noise)``."""

    def produce(residual, operands, decay, k, last_kth):
        grads, mu, nu, age, noise, count, scale, clip = operands
        mu, nu, age, noise, acc, values, indices, _ = adam_accumulate(
            grads, mu, nu, age, residual, count, b1=b1, b2=b2, eps=eps, masking=masking,
            mask=mask, scale=scale, decay=decay, k=k, last_kth=last_kth, noise=noise,
            nranks=nranks, warmup=warmup, clip=clip)
        return Accumulated(acc, values, indices, (mu, nu, age, noise))

    def part(operands, ids, take):
        # one group's gradient leaves and its entries of the flat moments; the
        # count, the learning rate and the clipping (the whole gradient's norm) are
        # the step's
        grads, mu, nu, age, noise, count, scale, clip = operands
        leaves = jax.tree_util.tree_leaves(grads)
        return ([leaves[i] for i in ids], take(mu), take(nu), take(age),
                None if noise is None else tuple(take(x) for x in noise), count, scale, clip)

    def produce_at(residual, operands, ids, at, decay, k, last_kth):
        # one group's pass on the whole flat state: the group's entries, in place
        # (`at`: one range, or each leaf's first entry)
        grads, mu, nu, age, noise, count, scale, clip = operands
        leaves = jax.tree_util.tree_leaves(grads)
        mu, nu, age, noise, acc, values, indices, _ = adam_accumulate(
            [leaves[i] for i in ids], mu, nu, age, residual, count, b1=b1, b2=b2, eps=eps,
            masking=masking, mask=mask, scale=scale, decay=decay, k=k, last_kth=last_kth,
            noise=noise, nranks=nranks, warmup=warmup, at=at, clip=clip)
        return (Accumulated(acc, values, indices, (mu, nu, age, noise)),
                (grads, mu, nu, age, noise, count, scale, clip))

    # masking reads a zero residual as "sent": a 16-bit wire's rounding must not stay
    # in the residual of a sent entry, or the mask of every entry sent never fires
    return AccumulatorSource(produce, lambda operands: operands[0], part, produce_at,
                             exact_sent=mask and masking != "off", scattered_parts=True)
