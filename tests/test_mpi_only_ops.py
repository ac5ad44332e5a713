"""Ops that exist on MPI only say so clearly when given a mesh axis; the others
accept it (tests/axis/ runs them under shard_map / pmap)."""

import jax.numpy as jnp
import pytest

import jax_sparse_sync as jss

AXIS = jss.axis("data")
V, I = jnp.ones(2), jnp.arange(2, dtype=jnp.int32)


@pytest.mark.parametrize("name,call", [
    ("sparse_allreduce_start", lambda: jss.sparse_allreduce_start(V, I, size=4, comm=AXIS)),
    ("calibrate", lambda: jss.planning.calibrate(AXIS)),
])
def test_axis_comm_is_rejected_by_name(name, call):
    with pytest.raises(TypeError, match=rf"jax_sparse_sync\.{name} runs over MPI only"):
        call()


@pytest.mark.parametrize("name,call", [
    ("oktopk_allreduce", lambda: jss.oktopk_allreduce(V, I, size=4, k=1, comm=AXIS)),
    ("oktopk_sync", lambda: jss.oktopk_sync(k=1, comm=AXIS).init({"w": jnp.ones(3)})),
    ("block_allreduce", lambda: jss.block_allreduce(jnp.ones(4), comm=AXIS)),
    ("block_sync", lambda: jss.block_sync(comm=AXIS).update(
        {"w": jnp.ones(3)}, jss.block_sync(comm=AXIS).init({"w": jnp.ones(3)}))),
])
def test_axis_comm_outside_a_mapped_context_names_the_missing_axis(name, call):
    # the mesh-axis transport exists for these; without shard_map/pmap no axis is bound
    with pytest.raises(NameError, match=rf"jax_sparse_sync\.{name}: `comm` is jss.axis\('data'\), "
                                        r"but no mesh axis named 'data' is bound here"):
        call()
