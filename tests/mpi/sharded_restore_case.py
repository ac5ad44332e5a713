"""sharded_sync saved with Orbax and restored at P = 2 -> 4 -> 3: run by
tests/test_sharded_sync.py under ``mpiexec -n 4``.

One job of 4 ranks plays three jobs, each on its own communicator:

1. ranks 0-1 (P = 2) train ``STEPS`` steps, bit for bit the single-process
   reference of 2 ranks (tests/sharded_reference.py), and save each rank's
   (parameters, optimizer state) with Orbax;
2. all 4 ranks restore those into ``jss.checkpoint_template``'s targets; a step
   on a rank's old state raises the ValueError naming ``reshard_state``; then
   ``jss.reshard_state(old, 4, rank=r)``: the inner optimizer's state and the
   owners' change residual re-cut exactly (the vector they make up, bit for bit
   the old one, so the change residual's sum is kept exactly), the gradient
   residuals' mean over ranks kept (bitwise: 2 and 4 are powers of two); then
   ``STEPS`` more steps, bit for bit the reference of 4 ranks continued from the
   resharded state, replicas identical; saved again;
3. ranks 0-2 (Q = 3) restore the 4 checkpoints the same way (the mean kept to
   rounding) and continue likewise.

Usage: ``mpiexec -n 4 python -m mpi4py tests/mpi/sharded_restore_case.py DIR``;
prints ``SHARDED RESTORE OK`` on rank 0 at the end.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402
from mpi4py import MPI  # noqa: E402
from sharded_reference import regions, sharded_sync_reference, slot_of  # noqa: E402

import jax_sparse_sync as jss  # noqa: E402
from jax_sparse_sync.transforms.reshard import pairwise_rank_sum  # noqa: E402

WORLD = MPI.COMM_WORLD
RANK = WORLD.Get_rank()
N, K, STEPS = 53, 6, 3
INNER = optax.adamw(0.05, weight_decay=0.1)


def wait_for_all():
    request = WORLD.Ibarrier()
    while not request.Test():
        time.sleep(0.01)


def targets(rank, size):
    return np.random.default_rng([90, rank, size]).standard_normal(N).astype(np.float32)


def grad_fns(size):
    return [lambda w, step, t=targets(r, size): (w - t) * np.float32(1 + step % 3)
            for r in range(size)]


def change_k(size):
    return min(K, slot_of(N, size))


def optimizer(comm):
    return jss.sharded_sync(INNER, k=K, change="topk", comm=comm)


def train(comm, params, state, first_step):
    """``STEPS`` steps on this rank of ``comm``, the replicas compared after each."""
    tx, size, rank = optimizer(comm), comm.Get_size(), comm.Get_rank()
    t = jnp.asarray(targets(rank, size))

    @jax.jit
    def step(p, s, i):
        updates, s = tx.update({"w": (p["w"] - t) * (1 + i % 3).astype(jnp.float32)}, s, p)
        return optax.apply_updates(p, updates), s

    for i in range(first_step, first_step + STEPS):
        params, state = step(params, state, jnp.int32(i))
        everyone = comm.allgather(np.asarray(params["w"]).tobytes())
        assert all(b == everyone[0] for b in everyone), f"replicas differ at step {i}"
    return params, state


def numpy_state(state):
    return jax.tree_util.tree_map(np.asarray, state)


def check_reference(comm, start_params, states, params, state, first_step):
    """The run equals the reference of comm's size continued from ``states`` (every
    rank's state before the steps; None: fresh), bit for bit."""
    size, rank = comm.Get_size(), comm.Get_rank()
    start = None if states is None else ([s.residual for s in states],
                                         [s.inner for s in states],
                                         [s.change_residual for s in states])
    ref = sharded_sync_reference(start_params, grad_fns(size), k=K, steps=STEPS, inner=INNER,
                                 change="topk", change_k=change_k(size), start=start,
                                 first_step=first_step)
    assert np.asarray(params["w"]).tobytes() == ref.params.tobytes(), f"P={size}: parameters"
    assert np.asarray(state.residual).tobytes() == ref.residuals[rank].tobytes()
    assert np.asarray(state.change_residual).tobytes() == ref.change_residuals[rank].tobytes()
    for ours, theirs in zip(jax.tree_util.tree_leaves(state.inner),
                            jax.tree_util.tree_leaves(ref.inner[rank])):
        assert np.asarray(ours).tobytes() == np.asarray(theirs).tobytes(), f"P={size}: inner"


def whole(pieces, size):
    """The vector the ranks' regions make up."""
    return np.concatenate([np.asarray(x)[:hi - lo] for x, (lo, hi) in
                           zip(pieces, regions(N, size))])


def restore(comm, old_size, directory, first_step):
    """This rank's restore of ``old_size`` checkpoints, resharded, checked, continued and saved."""
    size, rank = comm.Get_size(), comm.Get_rank()
    tx = optimizer(comm)
    params = {"w": jnp.zeros((N,), jnp.float32)}
    template = (params, jss.checkpoint_template(tx.init(params), old_size))
    ckpt = ocp.StandardCheckpointer()
    old = [ckpt.restore(directory / f"p{old_size}" / f"rank{i}", template)
           for i in range(old_size)]
    try:
        tx.update({"w": jnp.ones((N,))}, old[rank % old_size][1], old[0][0])
        raise AssertionError("a step on a state of another world size did not raise")
    except ValueError as e:
        assert "reshard_state" in str(e), e
    state = jss.reshard_state([s for _, s in old], size, rank=rank)
    everyone = comm.allgather(numpy_state(state))
    olds = [numpy_state(s) for _, s in old]
    # the regions re-cut: the vectors they make up are the old ones, bit for bit
    assert whole([s.change_residual for s in everyone], size).tobytes() == \
        whole([s.change_residual for s in olds], old_size).tobytes()
    for leaf in range(1, 3):  # the inner state's mu and nu (leaf 0 is its step count)
        new = [jax.tree_util.tree_leaves(s.inner)[leaf] for s in everyone]
        was = [jax.tree_util.tree_leaves(s.inner)[leaf] for s in olds]
        assert whole(new, size).tobytes() == whole(was, old_size).tobytes()
    new_mean = pairwise_rank_sum([s.residual for s in everyone]) / np.float32(size)
    old_mean = pairwise_rank_sum([s.residual for s in olds]) / np.float32(old_size)
    if size & (size - 1) == 0 and old_size & (old_size - 1) == 0:
        assert new_mean.tobytes() == old_mean.tobytes()
    else:
        np.testing.assert_allclose(new_mean, old_mean, rtol=1e-6, atol=1e-7)
    start = np.asarray(old[0][0]["w"])
    params, state = train(comm, jax.tree_util.tree_map(jnp.asarray, old[0][0]),
                          jax.tree_util.tree_map(jnp.asarray, state), first_step)
    check_reference(comm, start, everyone, params, state, first_step)
    return params, state


def save(directory, size, rank, params, state):
    ckpt = ocp.StandardCheckpointer()
    ckpt.save(directory / f"p{size}" / f"rank{rank}", (params, state))
    ckpt.wait_until_finished()


def main(directory: Path) -> None:
    start = np.random.default_rng(3).standard_normal(N).astype(np.float32)
    comm2 = WORLD.Split(0 if RANK < 2 else MPI.UNDEFINED, RANK)
    if RANK < 2:
        params = {"w": jnp.asarray(start)}
        params, state = train(comm2, params, optimizer(comm2).init(params), 0)
        check_reference(comm2, start, None, params, state, 0)
        save(directory, 2, RANK, params, state)
    wait_for_all()
    params, state = restore(WORLD, 2, directory, STEPS)
    save(directory, 4, RANK, params, state)
    wait_for_all()
    comm3 = WORLD.Split(0 if RANK < 3 else MPI.UNDEFINED, RANK)
    if RANK < 3:
        restore(comm3, 4, directory, 2 * STEPS)
    wait_for_all()
    if RANK == 0:
        print("SHARDED RESTORE OK", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
