"""One process of a ``jax.distributed`` job: the axis transport across processes.

Launched by tests/test_axis_transport.py as NPROC processes x DEVICES CPU
devices each (coordinator on 127.0.0.1 only):

    python tests/axis/multiprocess.py PROCESS_ID NPROC PORT DEVICES

One algorithm per collective (common.CROSS_PROCESS_ALGORITHMS), Ok-Topk and
block-sparse run over the global mesh axis (all devices of all processes) and
are checked against the NumPy reference; then a few
``topk_sync`` steps check that the parameters stay bitwise identical on every
device of every process. Prints ``OK`` lines; exits non-zero on a mismatch.
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))


def main(process_id: int, nproc: int, port: int, devices: int) -> None:
    # the suite's flags (tests/conftest.py: FAST_COMPILE_FLAG) kept, the device count added
    os.environ["XLA_FLAGS"] = (f"{os.environ.get('XLA_FLAGS', '')} "
                               f"--xla_force_host_platform_device_count={devices}").strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=nproc,
                               process_id=process_id, initialization_timeout=120)
    import hashlib

    import jax.numpy as jnp
    import numpy as np
    import optax
    from jax.experimental import multihost_utils
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import jax_sparse_sync as jss
    from common import CROSS_PROCESS_ALGORITHMS, N, make_pattern
    from reference import sparse_allreduce_reference

    p = jax.device_count()
    assert jax.process_count() == nproc and p == nproc * devices, (jax.process_count(), p)
    mesh = jax.make_mesh((p,), ("data",))
    rows = NamedSharding(mesh, P("data"))

    def global_rows(per_rank):  # [P, ...] global array from this process's rows
        local = [r for r, d in enumerate(mesh.devices.flat) if d.process_index == process_id]
        return jax.make_array_from_process_local_data(
            rows, np.stack([per_rank[r] for r in local]), (p,) + per_rank[0].shape)

    def local_rows(x):
        return [np.asarray(s.data) for s in x.addressable_shards]

    def same_in_every_process(x):  # a collective: every process calls it
        digests = multihost_utils.process_allgather(
            np.frombuffer(hashlib.sha256(x.tobytes()).digest(), np.uint8))
        return len({d.tobytes() for d in np.asarray(digests)}) == 1

    def check_identical_everywhere(name, out):
        """`out`, this process's devices' rows, bitwise the same on every device of every
        process."""
        everywhere = same_in_every_process(out[0])
        assert all(o.tobytes() == out[0].tobytes() for o in out), name
        assert everywhere, name
        print(f"OK process {process_id}: {name} over {p} devices in {nproc} processes",
              flush=True)

    inputs = [make_pattern("random", r, p) for r in range(p)]
    ref = sparse_allreduce_reference(inputs, N)
    for algorithm in CROSS_PROCESS_ALGORITHMS:
        def body(v, i, algorithm=algorithm):
            out = jss.sparse_allreduce(v[0], i[0], size=N, algorithm=algorithm,
                                       comm=jss.axis("data"))
            return out[None]

        f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("data"), P("data")),
                                  out_specs=P("data"), check_vma=False))
        out = local_rows(f(global_rows([v for v, _ in inputs]), global_rows([i for _, i in inputs])))
        for o in out:
            np.testing.assert_allclose(o[0], ref, rtol=1e-5, atol=1e-5)
        check_identical_everywhere(algorithm, out)

    # Ok-Topk (all_to_all + all_gather + psum) and block-sparse across the processes
    from common import block_input
    from reference import oktopk_reference, rank_order_sum

    def okt(v, i):
        return jss.oktopk_allreduce(v[0], i[0], size=N, k=40, comm=jss.axis("data")).sum[None]

    def blk(x):
        return jss.block_allreduce(x[0], block_size=16, comm=jss.axis("data"))[None]

    checks = [("oktopk_allreduce", okt, (global_rows([v for v, _ in inputs]),
                                         global_rows([i for _, i in inputs])),
               oktopk_reference(inputs, N, 40)[0], 1e-6),
              ("block_allreduce", blk, (global_rows([block_input("random", r, p)
                                                     for r in range(p)]),),
               rank_order_sum([block_input("random", r, p) for r in range(p)]), 0.0)]
    for name, body, args, expect, tol in checks:
        f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("data"),) * len(args),
                                  out_specs=P("data"), check_vma=False))
        out = local_rows(f(*args))
        np.testing.assert_allclose(out[0][0], expect, rtol=tol, atol=tol)
        check_identical_everywhere(name, out)

    # topk_sync in a shard_map-ped step: parameters replicated, residuals per device.
    dim = 64
    tx = optax.chain(jss.topk_sync(k=4, comm=jss.axis("data")), optax.sgd(0.1))
    targets = np.random.default_rng(0).standard_normal((p, dim)).astype(np.float32)

    def step(params, state, target):
        state = jax.tree_util.tree_map(lambda x: x[0], state)
        grads = jax.grad(lambda w: jnp.sum((w - target[0]) ** 2))(params)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), jax.tree_util.tree_map(lambda x: x[None], state)

    init = jax.jit(jax.shard_map(lambda w: jax.tree_util.tree_map(lambda x: x[None], tx.init(w)),
                                 mesh=mesh, in_specs=P(), out_specs=P("data"), check_vma=False))
    step = jax.jit(jax.shard_map(step, mesh=mesh, in_specs=(P(), P("data"), P("data")),
                                 out_specs=(P(), P("data")), check_vma=False))
    params = jax.make_array_from_callback((dim,), NamedSharding(mesh, P()),
                                          lambda idx: np.zeros(dim, np.float32)[idx])
    state = init(params)
    target = global_rows(list(targets))
    for _ in range(5):
        params, state = step(params, state, target)
    mine = local_rows(params)
    assert all(m.tobytes() == mine[0].tobytes() for m in mine)
    assert same_in_every_process(mine[0]), "parameters differ across processes"
    residuals = local_rows(state[0].residual)
    assert any(r.tobytes() != residuals[0].tobytes() for r in residuals), "residuals should differ"
    print(f"OK process {process_id}: topk_sync parameters identical on all {p} devices", flush=True)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:5]))
