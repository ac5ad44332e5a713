"""Primitives that lower to an XLA FFI custom call with the MPI ordered effect.

Every MPI-backed op (blocking allreduce, non-blocking start and done) is one
of these: JAX threads a token through them in program order, so no rank can
see its collectives reordered.
"""

from __future__ import annotations

from functools import partial

import jax
import numpy as np
from jax._src import dispatch
from jax.extend.core import Primitive
from jax.interpreters import mlir

from jax_sparse_sync.mpi.effects import abstract_token, mpi_effect

__all__ = ["ordered_ffi_primitive"]


def ordered_ffi_primitive(name: str, target: str, abstract_eval,
                          aliases: dict[int, int] | None = None) -> Primitive:
    """A primitive calling FFI ``target`` (CPU or CUDA) with a token in and out.

    ``abstract_eval(*avals, **params)`` returns the output avals (a tuple);
    every param reaches the handler as an int64 attribute, except those whose
    name starts with ``_`` (static shape information for Python only).
    ``aliases``: ``{operand: output}`` pairs of the primitive's own operands and
    outputs (the token not counted) whose buffers XLA shares, so the handler
    writes that output over that operand (XLA copies the operand first when
    its buffer is still needed, e.g. an argument of the jitted function that
    was not donated).
    """
    prim = Primitive(name)
    prim.multiple_results = True
    prim.def_impl(partial(dispatch.apply_primitive, prim))
    prim.def_effectful_abstract_eval(
        lambda *avals, **params: (tuple(abstract_eval(*avals, **params)), {mpi_effect}))
    # The token is operand 0 and result 0 of the custom call.
    rule = jax.ffi.ffi_lowering(
        target, has_side_effect=True,
        operand_output_aliases=({i + 1: o + 1 for i, o in aliases.items()} if aliases else None))

    def lowering(ctx, *operands, **params):
        token = ctx.tokens_in.get(mpi_effect)
        ctx_tok = ctx.replace(avals_in=(abstract_token, *ctx.avals_in),
                              avals_out=(abstract_token, *ctx.avals_out))
        token_out, *results = rule(ctx_tok, token, *operands,
                                   **{k: np.int64(v) for k, v in params.items()
                                      if not k.startswith("_")})
        ctx.set_tokens_out(mlir.TokenSet({mpi_effect: token_out}))
        return results

    # CUDA too: the CUDA module's MPI handlers (or the stand-in that says it was
    # not built) serve the same target names there.
    for platform in ("cpu", "cuda"):
        mlir.register_lowering(prim, lowering, platform=platform)
    return prim
