"""JAX compatibility helpers: shard_map's varying-axes typing across JAX versions.

Used by the mesh-axis transport and by the transforms (whose FFI calls and
``lax.switch`` branches must agree on the axes a value varies over).
"""

from __future__ import annotations

import jax

__all__ = ["vary", "varying_axes", "varying_like", "varying_as_inputs"]


def vary(x, name):
    """``x`` typed as varying over the axis (a no-op without check_vma)."""
    try:
        return jax.lax.pcast(x, name, to="varying")
    except ValueError:  # already varying
        return x


def varying_axes(v) -> frozenset:
    """The mesh axes shard_map's check_vma types ``v`` as varying over (empty without it)."""
    return _varying_axes(v)


def _varying_axes(v) -> frozenset:
    aval = jax.typeof(v)
    if hasattr(aval, "vma"):  # older jax
        return aval.vma
    return getattr(getattr(aval, "manual_axis_type", None), "varying", frozenset())


def varying_like(x, ref):
    """``x`` typed as varying over every mesh axis ``ref`` varies over (shard_map's check_vma).

    The branches of a ``lax.switch`` / ``cond`` must agree on the axes each
    output varies over; a per-device value built from an FFI call or a
    constant otherwise types as invariant in one branch and varying in
    another. Outside shard_map (or without check_vma) this is the identity.
    """
    missing = tuple(sorted(_varying_axes(ref) - _varying_axes(x)))
    return jax.lax.pcast(x, missing, to="varying") if missing else x


def varying_as_inputs(fn, **consts):
    """``fn`` with every output typed as varying over every mesh axis any input
    varies over (shard_map's check_vma): the FFI call's outputs otherwise type as
    invariant and the two branches of ``platform_dependent`` would disagree."""
    def wrapped(*args):
        out = fn(*args, **consts)
        refs = [x for x in jax.tree_util.tree_leaves(args) if isinstance(x, jax.Array)
                or hasattr(x, "aval")]
        def like(x):
            for r in refs:
                x = varying_like(x, r)
            return x
        return jax.tree_util.tree_map(like, out)
    return wrapped
