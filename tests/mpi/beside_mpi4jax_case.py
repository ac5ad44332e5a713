"""``mpi4jax`` and the syncs in the same jitted step: run by tests/test_beside_mpi4jax.py
under ``mpiexec -n P`` (P = 2-4).

Users average their loss and metrics with ``mpi4jax.allreduce`` in the step that
also syncs the gradients. Both are MPI collectives issued from inside XLA (the
library's on its own clone of COMM_WORLD, mpi4jax's on COMM_WORLD), so every
rank must issue them in the same order, and the library's non-blocking
transfers (a worker thread per communicator) must progress while mpi4jax's
``MPI_Allreduce`` runs on the caller's thread. Three steps, each bounded by
the test's timeout (a deadlock fails it):

1. ``topk_sync`` and the loss averaged with ``mpi4jax.allreduce`` in one
   ``jit``, 20 steps: the parameters bitwise equal on every rank after each
   step, the averaged loss equal on every rank and equal to the mean of the
   ranks' losses (mpi4py's allgather, summed in NumPy);
2. the non-blocking pair around it: ``sparse_allreduce_start``, then
   ``mpi4jax.allreduce``, then ``sparse_allreduce_done``, in one ``jit`` (the
   transfer in flight during mpi4jax's collective), 10 calls: the sparse sum
   bitwise equal to the NumPy reference (small integers: every order of
   summation gives the same bits);
3. ``grouped_topk_sync`` (two groups, one non-blocking allreduce each, started
   during the backward pass) with the loss averaged by mpi4jax, 10 steps:
   replicas bitwise equal.

Prints ``MPI4JAX OK`` on rank 0.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import optax
from mpi4py import MPI

import jax_sparse_sync as jss

# pytest imports every module under tests/ for its doctests (--doctest-modules):
# without the optional mpi4jax this script is skipped there, not an error
mpi4jax = pytest.importorskip("mpi4jax", reason="mpi4jax is not installed (optional)")

WORLD = MPI.COMM_WORLD
P, RANK = WORLD.Get_size(), WORLD.Get_rank()
WIDTH, BATCH = 40, 8


def same_everywhere(tree, what):
    flat = np.concatenate([np.asarray(x).ravel() for x in jax.tree_util.tree_leaves(tree)])
    everyone = WORLD.allgather(flat.tobytes())
    assert all(b == everyone[0] for b in everyone), f"{what} differs between ranks"


def batch(step):
    rng = np.random.default_rng(100 * step + RANK)
    x = rng.standard_normal((BATCH, WIDTH)).astype(np.float32)
    return x, (x[:, 0] - 0.5 * x[:, 1]).astype(np.float32)


def params0():
    return {"w": jnp.zeros((WIDTH,), jnp.float32), "b": jnp.zeros((3,), jnp.float32)}


def loss_fn(p, x, y):
    return jnp.mean((x @ p["w"] + p["b"].sum() - y) ** 2)


def train(tx, steps, what):
    @jax.jit
    def step(p, s, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(p, x, y)
        mean_loss = mpi4jax.allreduce(loss, op=MPI.SUM) / P  # the user's metric
        updates, s = tx.update(grads, s, p)
        return optax.apply_updates(p, updates), s, loss, mean_loss

    p, s = params0(), tx.init(params0())
    for i in range(steps):
        x, y = batch(i)
        p, s, loss, mean_loss = step(p, s, x, y)
        same_everywhere(p, f"{what}: the parameters at step {i}")
        same_everywhere(mean_loss, f"{what}: mpi4jax's averaged loss at step {i}")
        losses = WORLD.allgather(float(loss))
        assert np.isclose(float(mean_loss), np.float32(sum(losses)) / P, rtol=1e-5), \
            (float(mean_loss), losses)
    return p


def nonblocking(calls):
    size, k = 64, 6

    @jax.jit
    def step(values, indices, metric):
        pending = jss.sparse_allreduce_start(values, indices, size=size)
        total = mpi4jax.allreduce(metric, op=MPI.SUM)  # while the transfer is in flight
        return jss.sparse_allreduce_done(pending), total

    for i in range(calls):
        rng = np.random.default_rng(10 * i + RANK)
        indices = np.sort(rng.choice(size, k, replace=False)).astype(np.int32)
        values = rng.integers(-8, 9, k).astype(np.float32)
        summed, total = step(values, indices, jnp.float32(RANK + i))
        everyone = WORLD.allgather((values, indices))
        reference = np.zeros(size, np.float32)
        for v, ix in everyone:
            np.add.at(reference, ix, v)
        assert np.asarray(summed).tobytes() == reference.tobytes(), (summed, reference)
        assert float(total) == sum(r + i for r in range(P))


def main():
    train(optax.chain(jss.topk_sync(density=0.1), optax.sgd(0.05)), 20, "topk_sync")
    nonblocking(10)
    # two groups in backward (reverse tree) order: "w" (leaf 1) then "b" (leaf 0)
    grouped = jss.grouped_topk_sync([((1,), "normal"), ((0,), "normal")], density=0.1)
    train(optax.chain(grouped, optax.sgd(0.05)), 10, "grouped_topk_sync")
    WORLD.Barrier()
    if RANK == 0:
        print("MPI4JAX OK", flush=True)


if __name__ == "__main__":
    main()
