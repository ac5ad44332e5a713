"""Runs every algorithm on every pattern over MPI and saves rank 0's view.

Run under ``mpiexec -n P python tests/axis/mpi_results.py OUT.npz``;
tests/test_axis_transport.py compares the shard_map transport against it.
Every rank checks that its result is bitwise equal to rank 0's. Ok-Topk
(``oktopk/<case>/...``: sum, boundaries, threshold, stats, and every rank's
contributed mask) and block-sparse (``block/<case>/...``) are saved too.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main(path: str) -> None:
    import jax
    import numpy as np
    from mpi4py import MPI

    import jax_sparse_sync as jss
    from common import ALGORITHMS, BLOCK_CASES, N, PATTERNS, block_input, make_pattern, oktopk_cases

    world = MPI.COMM_WORLD
    rank, p = world.Get_rank(), world.Get_size()
    saved = {}

    def same_everywhere(what, out):
        first = world.bcast(out, root=0)
        if out.tobytes() != first.tobytes():
            raise SystemExit(f"rank {rank}: {what} differs from rank 0")

    for algorithm in ALGORITHMS:
        fn = jax.jit(lambda v, i, a=algorithm: jss.sparse_allreduce(
            v, i, size=N, algorithm=a, return_stats="vector"))
        for pattern in PATTERNS:
            values, indices = make_pattern(pattern, rank, p)
            out, stats = (np.asarray(x) for x in fn(values, indices))
            same_everywhere(f"{algorithm}/{pattern}", out)
            all_stats = world.gather(stats.astype(np.int64), root=0)
            if rank == 0:
                saved[f"{algorithm}/{pattern}/out"] = out
                saved[f"{algorithm}/{pattern}/stats"] = np.stack(all_stats)

    def save_oktopk(name, pattern, kw, boundaries=True):
        """Ok-Topk's results under ``name``/: the sum, every rank's contributed mask, the
        boundaries (unless not `boundaries`), the threshold and every rank's stats."""
        values, indices = make_pattern(pattern, rank, p)
        r = jax.jit(lambda v, i: jss.oktopk_allreduce(v, i, size=N, **kw))(values, indices)
        out = np.asarray(r.sum)
        same_everywhere(name, out)
        masks = world.gather(np.asarray(r.contributed), root=0)
        stats = world.gather(np.asarray(jax.numpy.stack(r.stats)).astype(np.int64), root=0)
        if rank == 0:
            saved[f"{name}/out"] = out
            saved[f"{name}/contributed"] = np.stack(masks)
            if boundaries:
                saved[f"{name}/boundaries"] = np.asarray(r.boundaries)
            saved[f"{name}/threshold"] = np.asarray(r.threshold)
            saved[f"{name}/stats"] = np.stack(stats)

    for case, (pattern, kw) in oktopk_cases(p).items():
        save_oktopk(f"oktopk/{case}", pattern, kw)

    from common import OKTOPK_WIRE_CASES
    for case in OKTOPK_WIRE_CASES:  # Ok-Topk's values on a bfloat16 wire
        pattern, kw = oktopk_cases(p)[case]
        save_oktopk(f"oktopk_bf16/{case}", pattern, dict(kw, wire_dtype=jax.numpy.bfloat16),
                    boundaries=False)

    for case, (pattern, block) in BLOCK_CASES.items():
        x = block_input(pattern, rank, p)
        out, stats = jax.jit(lambda v, b=block: jss.block_allreduce(
            v, block_size=b, return_stats="vector"))(x)
        out = np.asarray(out)
        same_everywhere(f"block/{case}", out)
        all_stats = world.gather(np.asarray(stats).astype(np.int64), root=0)
        if rank == 0:
            saved[f"block/{case}/out"] = out
            saved[f"block/{case}/stats"] = np.stack(all_stats)

    # oktopk_sync (threshold reuse) and block_sync training: parameters and residuals
    import jax.numpy as jnp
    import optax
    from common import SYNC_DIM, SYNC_LR, SYNC_RUNS, SYNC_STEPS, sync_grad, sync_targets
    for name, sync in SYNC_RUNS.items():
        tx = optax.chain(sync(jss), optax.sgd(SYNC_LR))
        target = jnp.asarray(sync_targets(p)[rank])

        @jax.jit
        def step(w, state, i, tx=tx, target=target):
            updates, state = tx.update({"w": sync_grad(w, target, i)}, state, {"w": w})
            return w + updates["w"], state

        w = jnp.zeros(SYNC_DIM, jnp.float32)
        state = tx.init({"w": w})
        for i in range(SYNC_STEPS):
            w, state = step(w, state, jnp.int32(i))
        w = np.asarray(w)
        same_everywhere(f"sync/{name}", w)
        residual = getattr(state[0], "residual", None)
        residuals = world.gather(None if residual is None else np.asarray(residual), root=0)
        if rank == 0:
            saved[f"sync/{name}/params"] = w
            if residual is not None:
                saved[f"sync/{name}/residual"] = np.stack(residuals)
    if rank == 0:
        np.savez(path, **saved)



if __name__ == "__main__":
    main(sys.argv[1])
