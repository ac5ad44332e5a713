"""The optional CUDA module: registration everywhere, the ops on a GPU when there is one.

On CPU: every FFI target has a CUDA handler (the real one, or a stand-in that
fails with a clear message), the stand-ins' messages, every op lowering for
CUDA, and (where .ci/run built it) the CUDA module serving every target. On a
GPU machine with the CUDA module (``JSS_CUDA=ON bash scripts/setup.sh``) and
``JAX_PLATFORMS=cuda,cpu`` (``cuda`` alone skips the one CPU comparison): the
ops on device arrays against the NumPy reference, and the MPI handlers on one
rank. The CUDA kernels themselves are checked bit for bit against the CPU
kernels in test_cuda_kernels.py.
"""

import json
import os
import pathlib
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jax_sparse_sync as jss
from jax_sparse_sync import _ext
from jax_sparse_sync.bindings.block_scan import block_scan
from reference import (bucket_topk_reference, magnitude_order, oktopk_reference,
                       sparse_allreduce_reference, topk_reference)

MODULE_MISSING = ("jax_sparse_sync was built without its CUDA module: rebuild with "
                  "JSS_CUDA=ON bash scripts/setup.sh, or run on CPU")
NO_CUDA_IMPLEMENTATION = ("has no CUDA implementation in this build's CUDA module (it was built "
                          "without some of its CUDA sources")

on_gpu = jax.default_backend() == "gpu"
needs_cuda_module = pytest.mark.skipif(
    not (on_gpu and _ext.cuda_available()),
    reason="needs a GPU (JAX_PLATFORMS=cuda) and the CUDA module (JSS_CUDA=ON bash scripts/setup.sh)")


# --- registration (runs everywhere) -------------------------------------------

def test_every_target_has_a_cuda_handler():
    assert set(_ext.CPU_TARGETS) <= set(_ext.CUDA_REGISTRATIONS)
    assert set(_ext.CPU_ONLY_TARGETS) <= set(_ext.CPU_TARGETS)
    kinds = set(_ext.CUDA_REGISTRATIONS.values())
    assert kinds <= {"cuda_module", "module_missing", "no_cuda_implementation"}
    if _ext.cuda_available():
        assert "module_missing" not in kinds
        assert set(_ext.cuda_targets()) == set(_ext.cuda_module.registrations())
    else:
        assert kinds == {"module_missing"} and _ext.cuda_targets() == ()


def test_cuda_module_source_registers_the_whole_contract():
    # ffi/cuda/cuda_handlers.h lists the CUDA handlers; module_cuda.cc must register
    # each under its CPU twin's target name (jss_topk -> JssTopkCuda).
    root = pathlib.Path(__file__).resolve().parent.parent
    declared = set(re.findall(r"XLA_FFI_DECLARE_HANDLER_SYMBOL\((\w+)\)",
                              (root / "ffi" / "cuda" / "cuda_handlers.h").read_text()))
    registered = dict(re.findall(r'd\["(jss_\w+)"\] = encapsulate\((\w+)\)',
                                 (root / "ffi" / "cuda" / "module_cuda.cc").read_text()))
    assert set(registered.values()) == declared
    for name, symbol in registered.items():
        assert symbol == "".join(part.capitalize() for part in name.split("_")) + "Cuda"
    assert set(registered) <= set(_ext.CPU_TARGETS)  # same ops on both platforms


def test_cuda_targets_reach_xla():
    from jax._src.lib import xla_client
    pending = xla_client._custom_callback.get(_ext.CUDA_PLATFORM)
    if pending is None:
        pytest.skip("a CUDA plugin took the registrations directly (GPU jaxlib)")
    # without a CUDA plugin XLA keeps them queued: each of ours is there once
    names = [entry[0] for entry in pending if entry[0].startswith("jss_")]
    assert sorted(names) == sorted(_ext.CUDA_REGISTRATIONS)


_LOAD_BUILT_CUDA_MODULE = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("jax_sparse_sync._jss_cuda", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
sys.modules["jax_sparse_sync._jss_cuda"] = module  # as if installed next to _jss_cpu
from jax_sparse_sync import _ext
print(json.dumps([_ext.cuda_available(), _ext.CPU_TARGETS, _ext.CUDA_REGISTRATIONS]))
"""


def test_built_cuda_module_serves_every_target():
    # .ci/run builds the CUDA module into build/cuda-check wherever nvcc exists
    # (no GPU needed to build or import it): loaded as the package's CUDA module,
    # every CPU target but the CPU-only ones must get a real CUDA handler.
    root = pathlib.Path(__file__).resolve().parent.parent
    built = sorted((root / "build" / "cuda-check").glob("_jss_cuda*.so"))
    if not built:
        pytest.skip("no CUDA module in build/cuda-check (.ci/run builds it where nvcc exists)")
    proc = subprocess.run([sys.executable, "-c", _LOAD_BUILT_CUDA_MODULE, str(built[0])],
                          cwd=root, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    available, cpu_targets, registrations = json.loads(proc.stdout.splitlines()[-1])
    assert available
    missing = sorted(n for n in cpu_targets
                     if registrations.get(n) != "cuda_module" and n not in _ext.CPU_ONLY_TARGETS)
    # the CPU-only ones keep the stand-in (their callers use XLA's fusion off CPU)
    assert all(registrations[n] == "no_cuda_implementation" for n in _ext.CPU_ONLY_TARGETS)
    assert not missing, (f"{built[0]} has no CUDA handler for {missing} (stale? rebuild with "
                         "the cmake lines of .ci/run)")


@pytest.mark.skipif(_ext.cuda_available(), reason="the CUDA module is built here")
def test_cuda_not_available_without_the_module():
    assert _ext.cuda_available() is False
    assert _ext.cuda_module is None


def _call_stand_in(kind: str):
    """Runs a stand-in handler on CPU, with arbitrary operands, results and attributes."""
    target = f"jss_test_stand_in_{kind}"
    jax.ffi.register_ffi_target(target, _ext.cpu_module.cuda_fallback_handlers()[kind],
                                platform="cpu")
    call = jax.ffi.ffi_call(target, (jax.ShapeDtypeStruct((5,), jnp.float32),
                                     jax.ShapeDtypeStruct((), jnp.int32)))
    cpu = _cpu_device()  # registered for the CPU: run it there on a GPU machine too
    return call(jax.device_put(jnp.ones(7), cpu), jax.device_put(jnp.arange(3, dtype=jnp.int32), cpu),
                size=np.int64(9), comm=np.int64(0))


def test_module_missing_message():
    with pytest.raises(Exception, match=re.escape(MODULE_MISSING)):
        jax.block_until_ready(_call_stand_in("module_missing"))


def test_no_cuda_implementation_message():
    with pytest.raises(Exception, match=re.escape(NO_CUDA_IMPLEMENTATION)):
        jax.block_until_ready(_call_stand_in("no_cuda_implementation"))


def _lowered_targets(fn, *args) -> set[str]:
    text = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    return set(re.findall(r"custom_call @(jss_\w+)", text))


def test_every_op_lowers_for_cuda():
    # Lowering needs no GPU: this checks each op (ordered MPI ones included)
    # emits its custom call for CUDA, where the registrations above serve it.
    x = jnp.linspace(-1.0, 1.0, 1024, dtype=jnp.float32)
    values, indices = jnp.ones(8), jnp.arange(8, dtype=jnp.int32)
    cases = {
        "jss_topk": (lambda x: jss.topk(x, 10), x),
        "jss_bucket_topk": (lambda x: jss.bucket_topk(x, 2, 256), x),
        "jss_threshold_select": (lambda x: jss.threshold_select(x, 0.5, 16), x),
        "jss_qsgd_quantize": (lambda x: jss.qsgd_quantize(x, bits=4), x),
        "jss_qsgd_dequantize": (lambda x: jss.qsgd_dequantize(
            *jss.qsgd_quantize(x, bits=4), size=1024, bits=4), x),
        "jss_block_scan": (lambda x: block_scan(x, 64), x),
        "jss_block_allreduce": (lambda x: jss.block_allreduce(x, block_size=64), x),
        "jss_dense_allreduce": (lambda x: jss.dense_allreduce(x), x),
        "jss_sparse_allreduce": (lambda v, i: jss.sparse_allreduce(v, i, size=64,
                                                                   algorithm="allgather"),
                                 values, indices),
        "jss_oktopk_allreduce": (lambda v, i: jss.oktopk_allreduce(v, i, size=64, k=4).sum,
                                 values, indices),
        "jss_sparse_allreduce_start": (lambda v, i: jss.sparse_allreduce_done(
            jss.sparse_allreduce_start(v, i, size=64)), values, indices),
    }
    for target, (fn, *args) in cases.items():
        assert target in _lowered_targets(fn, *args), target
    assert "jss_sparse_allreduce_done" in _lowered_targets(*cases["jss_sparse_allreduce_start"][:1],
                                                           values, indices)


# --- on a GPU without the CUDA module: the clear error --------------------------

@pytest.mark.skipif(not on_gpu or _ext.cuda_available(),
                    reason="needs a GPU and a build without the CUDA module")
def test_gpu_call_without_module_says_rebuild():
    with pytest.raises(Exception, match=re.escape(MODULE_MISSING)):
        jax.block_until_ready(jss.topk(jnp.ones(16), 4))


# --- on a GPU with the CUDA module: device arrays against the reference ----------

def _on_gpu(a):
    out = jax.device_put(a, jax.devices("gpu")[0])
    assert out.devices() == {jax.devices("gpu")[0]}
    return out


def _cpu_device():
    try:
        return jax.devices("cpu")[0]
    except RuntimeError:
        pytest.skip("no CPU backend next to the GPU (JAX_PLATFORMS=cuda): run with cuda,cpu")


def _target_built(name: str):
    if name not in _ext.cuda_targets():
        pytest.skip(f"{name} is not in this CUDA module build")


@needs_cuda_module
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, np.float16])
@pytest.mark.parametrize("n,k", [(1, 1), (1000, 0), (1000, 10), (4097, 41), (300_000, 3000),
                                 (2049, 2049)])
def test_gpu_topk(dtype, n, k):
    _target_built("jss_topk")
    x = np.random.default_rng(n + k).standard_normal(n).astype(dtype)
    v, i = jax.jit(jss.topk, static_argnums=1)(_on_gpu(x), k)
    assert v.devices() == {jax.devices("gpu")[0]}
    rv, ri = topk_reference(x, k)
    assert np.all(np.diff(np.asarray(i)) > 0)  # ascending, as jss.topk promises
    np.testing.assert_array_equal(np.asarray(i), ri)
    np.testing.assert_array_equal(np.asarray(v).view(np.uint8), rv.view(np.uint8))


@needs_cuda_module
def test_gpu_topk_ties_and_nan():
    _target_built("jss_topk")
    x = np.tile(np.array([1.0, -1.0, 0.5, -2.0], np.float32), 64)
    x[77] = np.nan
    for k in (1, 7, 64, 200):
        v, i = jss.topk(_on_gpu(x), k)
        order = np.argsort(np.asarray(i))
        rv, ri = topk_reference(x, k)
        np.testing.assert_array_equal(np.asarray(i)[order], ri)
        np.testing.assert_array_equal(np.asarray(v)[order].view(np.uint8), rv.view(np.uint8))


@needs_cuda_module
@pytest.mark.parametrize("k_per_bucket,bucket,n", [(2, 512, 5000), (16, 512, 4096), (4, 100, 1234)])
def test_gpu_bucket_topk(k_per_bucket, bucket, n):
    _target_built("jss_bucket_topk")
    x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    v, i = jss.bucket_topk(_on_gpu(x), k_per_bucket, bucket)
    rv, ri = bucket_topk_reference(x, k_per_bucket, bucket)
    got = sorted(zip(np.asarray(i).tolist(), np.asarray(v).tolist()))
    want = sorted(zip(ri.tolist(), rv.tolist()))
    assert got == want


@needs_cuda_module
@pytest.mark.parametrize("threshold", [0.0, 0.5, 2.0, 100.0])  # 0.0 and 0.5 overflow
def test_gpu_threshold_select(threshold):
    _target_built("jss_threshold_select")
    x = np.random.default_rng(3).standard_normal(100_000).astype(np.float32)
    x[::7] = 0.0
    capacity = 40_000
    v, i, count = jss.threshold_select(_on_gpu(x), threshold, capacity)
    want = np.flatnonzero((np.abs(x) >= threshold) & (x != 0)).astype(np.int32)
    assert int(count) == want.size
    m = min(want.size, capacity)  # the first m qualifying entries, in index order
    i, v = np.asarray(i), np.asarray(v)
    np.testing.assert_array_equal(i[:m], want[:m])
    np.testing.assert_array_equal(v[:m], x[want[:m]])
    assert (i[m:] == -1).all() and (v[m:] == 0).all()


@needs_cuda_module
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, np.float16])
@pytest.mark.parametrize("n,k,stride", [(1000, 1, 1), (100_000, 1000, 1), (100_000, 1, 1),
                                        (100_000, 100_000, 1), (100_000, 50, 16)])
def test_gpu_kth_magnitude(dtype, n, k, stride):
    _target_built("jss_kth_magnitude")
    from jax_sparse_sync.bindings.selection import kth_magnitude
    x = np.random.default_rng(n + k).standard_normal(n).astype(dtype)
    got = float(kth_magnitude(_on_gpu(x), k, stride=stride))
    sample = x[::stride]
    want = float(np.abs(sample[magnitude_order(sample)[k - 1]]).astype(np.float32))
    assert got == want


@needs_cuda_module
def test_gpu_residual_update_and_scatter_add():
    _target_built("jss_residual_update")
    _target_built("jss_scatter_add")
    from jax_sparse_sync.bindings.selection import residual_update, scatter_add
    rng = np.random.default_rng(4)
    acc = rng.standard_normal(10_000).astype(np.float32)
    idx = rng.choice(acc.size, 500, replace=False).astype(np.int32)
    idx[::9] = -1
    want = acc.copy()
    want[idx[idx >= 0]] = 0.0
    np.testing.assert_array_equal(np.asarray(residual_update(_on_gpu(acc), _on_gpu(idx))), want)
    values = rng.standard_normal(idx.size).astype(np.float32)
    dup = np.concatenate([idx, idx[:50]])  # repeated indices add up
    dup_values = np.concatenate([values, values[:50]])
    got = np.asarray(scatter_add(_on_gpu(acc), _on_gpu(dup_values), _on_gpu(dup)))
    expected = acc + sparse_allreduce_reference([(dup_values, dup)], acc.size)
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)


@needs_cuda_module
def test_gpu_qsgd_roundtrip_matches_cpu_decoding():
    _target_built("jss_qsgd_quantize")
    x = np.random.default_rng(5).standard_normal(10_000).astype(np.float32)
    packed, scales = jss.qsgd_quantize(_on_gpu(x), bits=4, bucket=1024, seed=3)
    cpu = _cpu_device()
    x_gpu = np.asarray(jss.qsgd_dequantize(packed, scales, size=x.size, bits=4, bucket=1024))
    x_cpu = np.asarray(jss.qsgd_dequantize(jax.device_put(packed, cpu), jax.device_put(scales, cpu),
                                           size=x.size, bits=4, bucket=1024))
    np.testing.assert_array_equal(x_gpu, x_cpu)  # decoding is deterministic
    want_scales = np.abs(np.pad(x, (0, 240)).reshape(-1, 1024)).max(axis=1)
    np.testing.assert_array_equal(np.asarray(scales), want_scales)
    level = np.repeat(want_scales, 1024)[:x.size] / 7  # 2^(bits-1) - 1 levels
    assert (np.abs(x_gpu - x) <= level * (1 + 1e-6)).all()


@needs_cuda_module
def test_gpu_block_scan():
    _target_built("jss_block_scan")
    x = np.zeros(10_000, np.float32)
    x[[5, 700, 701, 9999]] = 1.0
    mask = np.asarray(block_scan(_on_gpu(x), 64))
    want = np.zeros(-(-x.size // 64), bool)
    want[[0, 10, 156]] = True
    np.testing.assert_array_equal(mask, want)


@needs_cuda_module
@pytest.mark.parametrize("algorithm", ["dense", "allgather", "recursive_doubling",
                                       "split_allgather", "dsar_split_allgather",
                                       "hash_partition"])
def test_gpu_sparse_allreduce_single_rank(algorithm):
    rng = np.random.default_rng(11)
    size = 5000
    indices = rng.choice(size, 300, replace=False).astype(np.int32)
    indices[::10] = -1  # padding slots
    values = rng.standard_normal(300).astype(np.float32)
    out, stats = jax.jit(lambda v, i: jss.sparse_allreduce(
        v, i, size=size, algorithm=algorithm, return_stats=True))(_on_gpu(values), _on_gpu(indices))
    assert out.devices() == {jax.devices("gpu")[0]}
    want = sparse_allreduce_reference([(values, indices)], size).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(out), want)
    assert stats.algorithm_name == algorithm
    assert int(stats.result_nnz) == np.count_nonzero(values[indices >= 0])


@needs_cuda_module
def test_gpu_sparse_allreduce_empty_and_nan():
    size = 100
    out = jss.sparse_allreduce(_on_gpu(np.zeros(4, np.float32)),
                               _on_gpu(np.full(4, -1, np.int32)), size=size)
    np.testing.assert_array_equal(np.asarray(out), np.zeros(size, np.float32))
    with pytest.raises(Exception, match="non-finite"):
        jax.block_until_ready(jss.sparse_allreduce(
            _on_gpu(np.array([np.nan], np.float32)), _on_gpu(np.array([3], np.int32)), size=size))
    # on GPU the failed call's token fails the next MPI call until it is reset
    jss.mpi.reset_after_mpi_error()
    out = jss.sparse_allreduce(_on_gpu(np.ones(2, np.float32)), _on_gpu(np.arange(2, dtype=np.int32)),
                               size=size)
    np.testing.assert_array_equal(np.asarray(out)[:3], [1.0, 1.0, 0.0])


@needs_cuda_module
def test_gpu_oktopk_single_rank():
    rng = np.random.default_rng(2)
    size, k = 4000, 50
    x = rng.standard_normal(size).astype(np.float32)
    values, indices = topk_reference(x, 200)
    r = jss.oktopk_allreduce(_on_gpu(values), _on_gpu(indices), size=size, k=k)
    want, threshold, masks = oktopk_reference([(values, indices)], size, k)
    np.testing.assert_array_equal(np.asarray(r.sum), want.astype(np.float32))
    np.testing.assert_array_equal(np.asarray(r.contributed), masks[0])
    assert float(r.threshold) == pytest.approx(threshold, rel=0, abs=0)


@needs_cuda_module
def test_gpu_block_allreduce_single_rank():
    x = np.zeros(3000, np.float32)
    x[[1, 2, 1500, 2999]] = [1.0, -2.0, 3.5, 4.0]
    total, stats = jss.block_allreduce(_on_gpu(x), block_size=100, return_stats=True)
    np.testing.assert_array_equal(np.asarray(total), x)
    assert int(stats.result_nnz) == 3  # nonzero blocks


@needs_cuda_module
def test_gpu_dense_allreduce_single_rank():
    x = np.random.default_rng(0).standard_normal(3000).astype(np.float32)
    total, stats = jax.jit(lambda v: jss.dense_allreduce(v, return_stats=True),
                           donate_argnums=0)(_on_gpu(x))
    np.testing.assert_array_equal(np.asarray(total), x)
    assert int(stats.result_nnz) == 3000 and stats.algorithm_name == "dense"
    x[7] = np.nan
    with pytest.raises(Exception, match="non-finite"):
        jax.block_until_ready(jss.dense_allreduce(_on_gpu(x), nan_policy="raise"))
    jss.mpi.reset_after_mpi_error()


@needs_cuda_module
def test_gpu_topk_sync_step():
    import optax
    _target_built("jss_topk")
    params = {"b": jnp.zeros(32), "w": jnp.zeros((64, 32))}
    rng = np.random.default_rng(8)
    grads_np = {"b": rng.standard_normal(32).astype(np.float32),
                "w": rng.standard_normal((64, 32)).astype(np.float32)}
    k, lr = 100, 0.1
    tx = optax.chain(jss.topk_sync(k=k), optax.sgd(lr))
    p, g = jax.device_put((params, grads_np), jax.devices("gpu")[0])
    state = tx.init(p)
    updates, state = jax.jit(tx.update)(g, state, p)
    # selection is global over the leaves in tree order ("b" then "w"), one rank
    flat = np.concatenate([grads_np["b"], grads_np["w"].ravel()])
    values, idx = topk_reference(flat, k)
    sent = np.zeros_like(flat)
    sent[idx] = values
    got = np.concatenate([np.asarray(updates["b"]), np.asarray(updates["w"]).ravel()])
    np.testing.assert_allclose(got, -lr * sent, rtol=1e-6, atol=0)
    residual = state[0].residual
    got_residual = np.asarray(residual)  # flat: "b", then "w"
    np.testing.assert_array_equal(got_residual, flat - sent)


@needs_cuda_module
def test_gpu_nonblocking_pair():
    rng = np.random.default_rng(6)
    size = 2000
    calls = []
    for algorithm in ("allgather", "split_allgather", "recursive_doubling"):
        indices = rng.choice(size, 100, replace=False).astype(np.int32)
        values = rng.standard_normal(100).astype(np.float32)
        calls.append((values, indices, jss.sparse_allreduce_start(
            _on_gpu(values), _on_gpu(indices), size=size, algorithm=algorithm)))
    for values, indices, pending in reversed(calls):  # finish out of order
        out, stats = jss.sparse_allreduce_done(pending, return_stats=True)
        assert out.devices() == {jax.devices("gpu")[0]}
        want = sparse_allreduce_reference([(values, indices)], size).astype(np.float32)
        np.testing.assert_array_equal(np.asarray(out), want)
        assert int(stats.result_nnz) == 100


@needs_cuda_module
@pytest.mark.parametrize("nranks", [2, 3])
def test_gpu_mpi_suite(nranks):
    # The multi-rank MPI suite (test_multirank.py pins it to CPU) with every
    # rank's arrays on the GPU: the CUDA module's MPI handlers across ranks.
    # The ranks share the GPU, so none may preallocate most of its memory.
    from test_multirank import mpiexec
    root = pathlib.Path(__file__).resolve().parent.parent
    env = dict(os.environ, JAX_PLATFORMS="cuda", XLA_PYTHON_CLIENT_PREALLOCATE="false",
               PYTHONUNBUFFERED="1")
    files = ["tests/mpi/test_sparse_allreduce_mpi.py", "tests/mpi/test_nonblocking_mpi.py",
             "tests/mpi/test_oktopk_mpi.py", "tests/mpi/test_block_allreduce_mpi.py"]
    proc = subprocess.run([mpiexec(), "-n", str(nranks), sys.executable, "-m", "pytest", "-q", "-x",
                           "-p", "no:cacheprovider", "--timeout=120", "--timeout-method=thread",
                           *files], cwd=root, env=env, capture_output=True, text=True, timeout=900)
    tail = (proc.stdout + proc.stderr)[-6000:]
    assert proc.returncode == 0, f"mpiexec -n {nranks} on GPU failed:\n{tail}"
    assert " passed" in proc.stdout and "failed" not in proc.stdout, tail


@needs_cuda_module
@pytest.mark.parametrize("nranks,select", [(1, "equals_the_cpu_path and allgather and not split"),
                                           (2, "")])
def test_gpu_device_protocol_equals_the_cpu_handler(nranks, select):
    # The device-resident exchange (ffi/cuda/device_exchange_cuda.cu) against the CPU
    # path on the same calls: tests/mpi/device_protocol_case.py on GPU arrays, each call
    # repeated on CPU arrays, results and statistics compared bit for bit (signed zeros,
    # cancelling and shared indices, subnormals, NaN, 16-bit wires, unsorted input,
    # errors). Without a GPU the same file runs through the CPU seam
    # (tests/test_device_protocol.py).
    from test_multirank import mpiexec
    root = pathlib.Path(__file__).resolve().parent.parent
    env = dict(os.environ, JAX_PLATFORMS="cuda,cpu", XLA_PYTHON_CLIENT_PREALLOCATE="false",
               PYTHONUNBUFFERED="1")
    proc = subprocess.run([mpiexec(), "-n", str(nranks), sys.executable, "-m", "pytest", "-q", "-x",
                           "-p", "no:cacheprovider", "--timeout=120", "--timeout-method=thread",
                           "tests/mpi/device_protocol_case.py",
                           *(["-k", select] if select else [])],
                          cwd=root, env=env, capture_output=True, text=True, timeout=600)
    tail = (proc.stdout + proc.stderr)[-6000:]
    assert proc.returncode == 0, f"mpiexec -n {nranks} on GPU failed:\n{tail}"
    assert " passed" in proc.stdout and "failed" not in proc.stdout, tail
