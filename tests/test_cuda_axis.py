"""The CUDA tests' mesh-transport twins: ``comm=jss.axis("data")`` on GPU arrays.

tests/test_cuda_module.py runs each MPI-path collective and ``topk_sync`` on GPU arrays
at one rank, and tests/test_cuda_kernels.py the sync steps on the GPU against the CPU.
Here each of those runs through the mesh transport instead: ``jax.shard_map`` over a
one-device mesh of the GPU, where the selection is the CUDA module's kernel and the
exchange JAX's collectives (no host stage). Each twin checks what its MPI test checks
(the NumPy reference, the statistics, the error) and, since the axis transport returns
the MPI transport's result bit for bit (docs/transports.md), the MPI path's result on
the same GPU arrays. Skipped exactly where the originals are: without a GPU
(``JAX_PLATFORMS=cuda,cpu``) and the CUDA module; the kernels' twin also needs the CPU
backend in the same process.

Not twinned: the non-blocking pair (``sparse_allreduce_start/done`` are MPI-only), and
the multi-rank MPI suites on the GPU (``test_gpu_mpi_suite``, the device-resident
exchange's protocol): the axis suites (tests/axis/) need 8 devices, which one GPU is not.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import jax_sparse_sync as jss
from jax_sparse_sync import _ext
from reference import oktopk_reference, sparse_allreduce_reference, topk_reference

#: the device kind the twins run on (a CPU run of their logic sets "cpu")
KIND = "gpu"
on_gpu = jax.default_backend() == "gpu"
needs_cuda_module = pytest.mark.skipif(
    not (on_gpu and _ext.cuda_available()),
    reason="needs a GPU (JAX_PLATFORMS=cuda) and the CUDA module (JSS_CUDA=ON bash scripts/setup.sh)")
AXIS = jss.axis("data")


def _devices(kind):
    try:
        return jax.devices(kind)
    except RuntimeError:
        return []


def _device():
    return jax.devices(KIND)[0]


def _put(a, device=None):
    out = jax.device_put(a, device or _device())
    assert out.devices() == {device or _device()}
    return out


def _target_built(name: str):
    if KIND == "gpu" and name not in _ext.cuda_targets():
        pytest.skip(f"{name} is not in this CUDA module build")


@functools.cache
def _mesh(device):
    return Mesh(np.array([device]), ("data",))


def on_mesh(fn, device=None, out_specs=P()):
    """``jit(shard_map(fn))`` over the one-device mesh of ``device`` (the GPU): every
    operand and result replicated, which on one device is the device's own array."""
    return jax.jit(jax.shard_map(fn, mesh=_mesh(device or _device()), in_specs=P(),
                                 out_specs=out_specs, check_vma=False))


def assert_same_bits(a, b, what):
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape, what
    assert a.tobytes() == b.tobytes(), what


# --- test_cuda_module.py's single-rank collectives, on the axis ------------------------

@needs_cuda_module
@pytest.mark.parametrize("algorithm", ["dense", "allgather", "recursive_doubling",
                                       "split_allgather", "dsar_split_allgather",
                                       "hash_partition"])
def test_axis_gpu_sparse_allreduce_single_device(algorithm):
    # twin of test_gpu_sparse_allreduce_single_rank
    rng = np.random.default_rng(11)
    size = 5000
    indices = rng.choice(size, 300, replace=False).astype(np.int32)
    indices[::10] = -1  # padding slots
    values = rng.standard_normal(300).astype(np.float32)
    v, i = _put(values), _put(indices)
    out, stats = on_mesh(lambda v, i: jss.sparse_allreduce(
        v, i, size=size, algorithm=algorithm, comm=AXIS, return_stats="vector"))(v, i)
    assert out.devices() == {_device()}
    want = sparse_allreduce_reference([(values, indices)], size).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(out), want)
    mpi, mpi_stats = jax.jit(lambda v, i: jss.sparse_allreduce(
        v, i, size=size, algorithm=algorithm, return_stats=True))(v, i)
    assert_same_bits(out, mpi, f"{algorithm}: axis against MPI")
    stats = jss.SyncStats.from_vector(stats)
    assert stats.algorithm_name == algorithm
    assert int(stats.result_nnz) == int(mpi_stats.result_nnz) == np.count_nonzero(
        values[indices >= 0])


@needs_cuda_module
def test_axis_gpu_sparse_allreduce_empty_and_nan():
    # twin of test_gpu_sparse_allreduce_empty_and_nan: the axis raises from the gathered
    # headers on every device (a host callback), with no MPI token to reset after it
    size = 100
    call = on_mesh(lambda v, i: jss.sparse_allreduce(v, i, size=size, comm=AXIS))
    out = call(_put(np.zeros(4, np.float32)), _put(np.full(4, -1, np.int32)))
    np.testing.assert_array_equal(np.asarray(out), np.zeros(size, np.float32))
    with pytest.raises(Exception, match="non-finite"):
        jax.block_until_ready(call(_put(np.array([np.nan], np.float32)),
                                   _put(np.array([3], np.int32))))
    out = call(_put(np.ones(2, np.float32)), _put(np.arange(2, dtype=np.int32)))
    np.testing.assert_array_equal(np.asarray(out)[:3], [1.0, 1.0, 0.0])


@needs_cuda_module
def test_axis_gpu_oktopk_single_device():
    # twin of test_gpu_oktopk_single_rank
    rng = np.random.default_rng(2)
    size, k = 4000, 50
    x = rng.standard_normal(size).astype(np.float32)
    values, indices = topk_reference(x, 200)
    v, i = _put(values), _put(indices)

    def body(v, i, comm=AXIS):
        r = jss.oktopk_allreduce(v, i, size=size, k=k, comm=comm)
        return r.sum, r.contributed, r.threshold

    got = on_mesh(body)(v, i)
    want, threshold, masks = oktopk_reference([(values, indices)], size, k)
    np.testing.assert_array_equal(np.asarray(got[0]), want.astype(np.float32))
    np.testing.assert_array_equal(np.asarray(got[1]), masks[0])
    assert float(got[2]) == pytest.approx(threshold, rel=0, abs=0)
    for a, b, what in zip(got, jax.jit(functools.partial(body, comm=None))(v, i),
                          ("sum", "contributed", "threshold")):
        assert_same_bits(a, b, f"oktopk {what}: axis against MPI")


@needs_cuda_module
def test_axis_gpu_block_allreduce_single_device():
    # twin of test_gpu_block_allreduce_single_rank
    x = np.zeros(3000, np.float32)
    x[[1, 2, 1500, 2999]] = [1.0, -2.0, 3.5, 4.0]
    total, stats = on_mesh(lambda x: jss.block_allreduce(
        x, block_size=100, comm=AXIS, return_stats="vector"))(_put(x))
    np.testing.assert_array_equal(np.asarray(total), x)
    assert int(jss.SyncStats.from_vector(stats).result_nnz) == 3  # nonzero blocks
    assert_same_bits(total, jss.block_allreduce(_put(x), block_size=100), "block: axis and MPI")


@needs_cuda_module
def test_axis_gpu_dense_allreduce_single_device():
    # twin of test_gpu_dense_allreduce_single_rank: one psum over the one device
    x = np.random.default_rng(0).standard_normal(3000).astype(np.float32)
    total, stats = on_mesh(lambda v: jss.dense_allreduce(
        v, comm=AXIS, return_stats="vector"))(_put(x))
    np.testing.assert_array_equal(np.asarray(total), x)
    stats = jss.SyncStats.from_vector(stats)
    assert int(stats.result_nnz) == 3000 and stats.algorithm_name == "dense"
    x[7] = np.nan
    with pytest.raises(Exception, match="non-finite"):
        jax.block_until_ready(on_mesh(lambda v: jss.dense_allreduce(
            v, comm=AXIS, nan_policy="raise"))(_put(x)))


def per_device(tree):
    return jax.tree.map(lambda a: a[None], tree)


def local(tree):
    return jax.tree.map(lambda a: a[0], tree)


def axis_programs(tx, device):
    """``tx``'s init and update on the one-device mesh: the state per device (a leading
    axis of 1), gradients and parameters replicated."""
    rows = P("data")
    mesh = _mesh(device)
    init = jax.jit(jax.shard_map(lambda p: per_device(tx.init(p)), mesh=mesh, in_specs=P(),
                                 out_specs=rows, check_vma=False))

    def update(g, s, p):
        u, s = tx.update(g, local(s), p)
        return u, per_device(s)

    return init, jax.jit(jax.shard_map(update, mesh=mesh, in_specs=(P(), rows, P()),
                                       out_specs=(P(), rows), check_vma=False))


@needs_cuda_module
def test_axis_gpu_topk_sync_step():
    # twin of test_gpu_topk_sync_step; and the MPI transform's update, bit for bit
    import optax
    _target_built("jss_topk")
    params = {"b": np.zeros(32, np.float32), "w": np.zeros((64, 32), np.float32)}
    rng = np.random.default_rng(8)
    grads_np = {"b": rng.standard_normal(32).astype(np.float32),
                "w": rng.standard_normal((64, 32)).astype(np.float32)}
    k, lr = 100, 0.1
    tx = optax.chain(jss.topk_sync(k=k, comm=AXIS), optax.sgd(lr))
    p, g = jax.device_put((params, grads_np), _device())
    init, update = axis_programs(tx, _device())
    updates, state = update(g, init(p), p)
    assert updates["w"].devices() == {_device()}
    flat = np.concatenate([grads_np["b"], grads_np["w"].ravel()])
    values, idx = topk_reference(flat, k)
    sent = np.zeros_like(flat)
    sent[idx] = values
    got = np.concatenate([np.asarray(updates["b"]), np.asarray(updates["w"]).ravel()])
    np.testing.assert_allclose(got, -lr * sent, rtol=1e-6, atol=0)
    residual = np.asarray(state[0].residual)  # one row per device
    assert residual.shape == (1, flat.size)
    np.testing.assert_array_equal(residual[0], flat - sent)
    tx_mpi = optax.chain(jss.topk_sync(k=k), optax.sgd(lr))
    mpi_updates, mpi_state = jax.jit(tx_mpi.update)(g, tx_mpi.init(p), p)
    for name in ("b", "w"):
        assert_same_bits(updates[name], mpi_updates[name], f"update {name}: axis and MPI")
    assert_same_bits(residual[0], mpi_state[0].residual, "residual: axis and MPI")


# --- test_cuda_kernels.py's sync steps, on the axis ------------------------------------

GPUS, CPUS = _devices("gpu"), _devices("cpu")
needs_both_backends = pytest.mark.skipif(
    not (GPUS and CPUS and _ext.cuda_available()),
    reason="needs a GPU and the CPU backend in one process (JAX_PLATFORMS=cuda,cpu) and the "
           "CUDA module (JSS_CUDA=ON bash scripts/setup.sh)")


def sync_steps_on_the_axis(tx, params, grads, device):
    """Three axis updates of ``tx`` on ``device``'s mesh: (updates, state) as NumPy, and
    the update's lowered text."""
    put = functools.partial(jax.device_put, device=device)
    with jax.default_device(device):
        init, update = axis_programs(tx, device)
        state = init(put(params))
        outs = []
        for g in grads:
            u, state = update(put(g), state, put(params))
            outs.append(u)
        text = update.lower(put(grads[0]), state, put(params)).as_text()
    return jax.tree.map(np.asarray, (outs, local(state))), text


@needs_both_backends
@pytest.mark.parametrize("adam", [False, True])
def test_axis_sync_steps_run_the_cuda_kernels_and_match_cpu_and_mpi(adam):
    # twin of test_sync_steps_run_the_cuda_kernels_and_match_cpu: topk_sync and
    # adam_direction_sync(topk_sync) through jss.axis on the GPU's one-device mesh lower
    # to the fused kernels and give the CPU mesh's updates and state bit for bit, and the
    # MPI transport's on the GPU
    rng = np.random.default_rng(5)
    params = {"w": rng.standard_normal((300, 200)).astype(np.float32),
              "b": rng.standard_normal(300).astype(np.float32)}
    grads = [jax.tree.map(lambda p, s=s: np.random.default_rng(s).standard_normal(
        p.shape).astype(np.float32), params) for s in range(3)]

    def make(comm):
        sync = jss.topk_sync(density=0.01, comm=comm)
        return jss.adam_direction_sync(sync) if adam else sync

    gpu, cpu = GPUS[0] if KIND == "gpu" else CPUS[0], CPUS[0]
    (on_gpu_, text), (on_cpu, _) = (sync_steps_on_the_axis(make(AXIS), params, grads, d)
                                    for d in (gpu, cpu))
    assert ("jss_adam_accumulate" if adam else "jss_accumulate_topk") in text
    assert_tree_same_bits(on_cpu, on_gpu_, "axis steps: CPU and GPU")
    tx = make(None)
    with jax.default_device(gpu):
        put = functools.partial(jax.device_put, device=gpu)
        state, update, outs = tx.init(put(params)), jax.jit(tx.update), []
        for g in grads:
            u, state = update(put(g), state, put(params))
            outs.append(u)
    assert_tree_same_bits(jax.tree.map(np.asarray, (outs, state)), on_gpu_,
                          "GPU steps: MPI and axis", skip=("stats", ".world"))


def assert_tree_same_bits(a, b, what, skip=()):
    """Leaf by leaf, matched by path; ``skip``: leave out the leaves whose path has one
    of these in it (the wire statistics, which each transport counts its own way, and
    the MPI state's ``world``, ``None`` on a mesh axis)."""
    leaves = [{jax.tree_util.keystr(path): leaf
               for path, leaf in jax.tree_util.tree_flatten_with_path(t)[0]
               if not any(s in jax.tree_util.keystr(path) for s in skip)} for t in (a, b)]
    assert leaves[0].keys() == leaves[1].keys(), (what, sorted(leaves[0]), sorted(leaves[1]))
    for path, x in leaves[0].items():
        assert_same_bits(x, leaves[1][path], f"{what}: {path}")
