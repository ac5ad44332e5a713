"""Ops that exist on MPI only say so clearly when given a mesh axis."""

import jax.numpy as jnp
import pytest

import jax_sparse_sync as jss

AXIS = jss.axis("data")
V, I = jnp.ones(2), jnp.arange(2, dtype=jnp.int32)


@pytest.mark.parametrize("name,call", [
    ("oktopk_allreduce", lambda: jss.oktopk_allreduce(V, I, size=4, k=1, comm=AXIS)),
    ("oktopk_sync", lambda: jss.oktopk_sync(k=1, comm=AXIS)),
    ("block_allreduce", lambda: jss.block_allreduce(jnp.ones(4), comm=AXIS)),
    ("block_sync", lambda: jss.block_sync(comm=AXIS)),
    ("sparse_allreduce_start", lambda: jss.sparse_allreduce_start(V, I, size=4, comm=AXIS)),
    ("calibrate", lambda: jss.calibrate(AXIS)),
])
def test_axis_comm_is_rejected_by_name(name, call):
    with pytest.raises(TypeError, match=rf"jax_sparse_sync\.{name} runs over MPI only"):
        call()
