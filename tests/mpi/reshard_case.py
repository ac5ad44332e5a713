"""Restore at another world size, end to end: run by tests/test_reshard.py under ``mpiexec -n 8``.

One job of 8 ranks plays three jobs, each on its own communicator (as separate
jobs would; the transforms take ``comm=``):

1. ranks 0-3 (P = 4) train ``STEPS`` steps and save each rank's optimizer state
   to ``<dir>/rank<r>.npz`` as plain arrays (the recipe of
   docs/topics/reliability.md);
2. ranks 0-3 (Q = 4), ranks 0-1 (Q = 2), then all 8 ranks (Q = 8) load them:
   a step on a rank's own old state, not resharded, must raise the ValueError
   naming ``reshard_state`` (not at Q = 4); then
   ``jss.reshard_state(old_states, Q, rank=r)``, and ``MORE_STEPS`` more steps,
   with every replica's parameters bitwise equal after each step and the
   residuals' mean over ranks equal (bitwise) to the old one. At Q = 4 the
   continued run must end bitwise equal to the uninterrupted one (phase 1
   goes on for ``MORE_STEPS`` after saving).

The optimizer state is a tuple of four chains, one per sync (``topk_sync``
with reused thresholds, ``oktopk_sync``, ``shared_support_sync`` and
``adam_direction_sync(topk_sync)``), each on its own parameters; worker j of W
computes the mean gradient of its contiguous shard of one global batch (a
linear regression), so the global batch is the same at every W.

Ranks that are not in a phase wait in a polling barrier (``Ibarrier`` and
sleep), so they do not spin on the 2 shared cores.

Usage: ``mpiexec -n 8 python -m mpi4py tests/mpi/reshard_case.py DIR`` (``-m mpi4py``: a
failing rank ends the job); prints ``RESHARD OK`` on rank 0 at the end.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from mpi4py import MPI

import jax_sparse_sync as jss
from jax_sparse_sync.transforms.reshard import pairwise_rank_sum

STEPS, MORE_STEPS = 6, 4
BATCH, WIDTH = 64, 24
WORLD = MPI.COMM_WORLD
RANK = WORLD.Get_rank()


def wait_for_all():
    request = WORLD.Ibarrier()
    while not request.Test():
        time.sleep(0.01)


def make_optimizers(comm):
    """Four optimizers with their syncs on ``comm`` (one chain per sync)."""
    return (
        optax.chain(jss.topk_sync(density=0.25, selection="threshold_reuse", tau=4, comm=comm),
                    optax.sgd(0.05)),
        optax.chain(jss.oktopk_sync(density=0.25, tau=4, tau_prime=4, comm=comm),
                    optax.sgd(0.05)),
        optax.chain(jss.shared_support_sync(density=0.25, comm=comm), optax.sgd(0.05)),
        optax.chain(jss.adam_direction_sync(jss.topk_sync(density=0.25, comm=comm)),
                    optax.sgd(0.01)),
    )


def data():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, WIDTH)).astype(np.float32)
    y = (x @ rng.standard_normal(WIDTH).astype(np.float32) + 0.1).astype(np.float32)
    return x, y


def initial_params():
    return tuple({"w": jnp.zeros((WIDTH,), jnp.float32), "b": jnp.zeros((1,), jnp.float32)}
                 for _ in range(4))


def make_step(optimizers, rank, size):
    x, y = data()
    shard = slice(rank * BATCH // size, (rank + 1) * BATCH // size)
    xs, ys = jnp.asarray(x[shard]), jnp.asarray(y[shard])

    def loss(p):
        return jnp.mean((xs @ p["w"] + p["b"][0] - ys) ** 2)

    @jax.jit
    def step(params, states):
        new_params, new_states = [], []
        for tx, p, s in zip(optimizers, params, states):
            updates, s = tx.update(jax.grad(loss)(p), s, p)
            new_params.append(optax.apply_updates(p, updates))
            new_states.append(s)
        return tuple(new_params), tuple(new_states)
    return step


def check_replicas(params, comm, when):
    flat = np.concatenate([np.asarray(leaf).ravel() for leaf in jax.tree_util.tree_leaves(params)])
    everyone = comm.allgather(flat.tobytes())
    assert all(b == everyone[0] for b in everyone), f"replicas differ {when}"


def residual_means(states_by_rank):
    """Per sync: the residuals' mean over ranks (pairwise rank sum / P), as bytes."""
    size = len(states_by_rank)
    out = []
    for which in range(4):
        inner = [s[which][0] for s in states_by_rank]  # the chain's sync state
        residuals = [np.asarray(getattr(x, "sync", x).residual) for x in inner]
        out.append((pairwise_rank_sum(residuals) / np.float32(size)).tobytes())
    return out


def save(states, params, directory: Path, rank):
    leaves = jax.tree_util.tree_leaves(states)
    np.savez(directory / f"rank{rank}.npz", *[np.asarray(x) for x in leaves])
    if rank == 0:
        np.savez(directory / "params.npz", *[np.asarray(x) for x in jax.tree_util.tree_leaves(
            params)])


def load(template, path: Path):
    """A state tree shaped like ``template`` from a file of its leaves (plain npz)."""
    with np.load(path) as f:
        leaves = [f[f"arr_{i}"] for i in range(len(f.files))]
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(template), leaves)


def train_phase(directory: Path):
    comm = WORLD.Split(0 if RANK < 4 else MPI.UNDEFINED, RANK)
    if comm == MPI.COMM_NULL:
        return
    optimizers = make_optimizers(comm)
    params = initial_params()
    states = tuple(tx.init(p) for tx, p in zip(optimizers, params))
    step = make_step(optimizers, comm.Get_rank(), 4)
    for i in range(STEPS):
        params, states = step(params, states)
        check_replicas(params, comm, f"at P = 4, step {i}")
    save(states, params, directory, comm.Get_rank())
    for i in range(MORE_STEPS):  # the uninterrupted run, for the restore at 4
        params, states = step(params, states)
    if comm.Get_rank() == 0:
        np.savez(directory / "uninterrupted.npz",
                 *[np.asarray(x) for x in jax.tree_util.tree_leaves(params)])



def restore_phase(directory: Path, new_size: int):
    comm = WORLD.Split(0 if RANK < new_size else MPI.UNDEFINED, RANK)
    if comm == MPI.COMM_NULL:
        return
    rank = comm.Get_rank()
    optimizers = make_optimizers(comm)
    params = load(initial_params(), directory / "params.npz")
    template = tuple(tx.init(p) for tx, p in zip(optimizers, params))
    old = [load(template, directory / f"rank{r}.npz") for r in range(4)]
    step = make_step(optimizers, rank, new_size)

    # not resharded: a clear error naming the function to call, before any collective
    try:
        if new_size != 4:
            step(params, old[rank % 4])
    except ValueError as e:
        assert "reshard_state" in str(e) and "written by 4 ranks" in str(e), e
        assert f"has {new_size}" in str(e), e
    else:
        assert new_size == 4, f"a P = 4 state stepped at Q = {new_size} without an error"

    states = jss.reshard_state(old, new_size, rank=rank)
    # the residuals' mean over ranks: bitwise the old one (4 and Q powers of two)
    everyone = comm.allgather(states)
    assert residual_means(everyone) == residual_means(old), "residual mean not preserved"
    # what reshard_state gives rank r alone is its entry of the whole list
    whole = jss.reshard_state(old, new_size)
    for a, b in zip(jax.tree_util.tree_leaves(whole[rank]), jax.tree_util.tree_leaves(states)):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
    for i in range(MORE_STEPS):
        params, states = step(params, states)
        check_replicas(params, comm, f"at Q = {new_size}, step {i} after the restore")
        for s in states:
            assert int(s[0].count) == STEPS + i + 1
    assert all(np.all(np.isfinite(np.asarray(x))) for x in jax.tree_util.tree_leaves(params))
    if new_size == 4:  # resharded to its own size: bitwise the uninterrupted run
        expected = load(params, directory / "uninterrupted.npz")
        for a, b in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(expected)):
            assert np.asarray(a).tobytes() == np.asarray(b).tobytes(), "4 -> 4 changed the run"



def main():
    directory = Path(sys.argv[1])
    train_phase(directory)
    wait_for_all()
    restore_phase(directory, 4)
    wait_for_all()
    restore_phase(directory, 2)
    wait_for_all()
    restore_phase(directory, 8)
    wait_for_all()
    if RANK == 0:
        print("RESHARD OK", flush=True)


if __name__ == "__main__":
    main()
