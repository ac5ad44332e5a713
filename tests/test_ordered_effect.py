"""Every MPI custom call is ordered: a token threads through them in program order."""

import re

import jax
import jax.numpy as jnp

import jax_sparse_sync as jss
from jax_sparse_sync.mpi.effects import mpi_effect


def two_allreduces(a, b):
    i = jnp.arange(4, dtype=jnp.int32)
    x = jss.sparse_allreduce(a, i, size=8, algorithm="allgather")
    y = jss.sparse_allreduce(b, i, size=8, algorithm="recursive_doubling")
    return x, y


def test_primitive_declares_the_ordered_effect():
    jaxpr = jax.make_jaxpr(two_allreduces)(jnp.ones(4), jnp.ones(4))
    assert mpi_effect in jaxpr.effects
    assert sum(eqn.primitive.name == "jss_sparse_allreduce" for eqn in jaxpr.eqns) == 2


def test_lowering_chains_the_token_between_calls():
    text = jax.jit(two_allreduces).lower(jnp.ones(4), jnp.ones(4)).as_text()
    calls = re.findall(r"(%\S+):\d+ = stablehlo.custom_call @jss_sparse_allreduce\((%[^,]+),", text)
    assert len(calls) == 2, text
    # the second call consumes the token the first one produced
    (first_result, _), (_, second_token_in) = calls
    assert second_token_in == f"{first_result}#0", text
