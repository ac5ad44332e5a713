"""The axis transport (jss.axis) on 8 host CPU devices, run by test_axis_transport.py.

JAX fixes the number of host devices when it starts, so this module runs in a
subprocess with ``XLA_FLAGS=--xla_force_host_platform_device_count=8`` set
before JAX is imported; in any other process it skips itself. The MPI results
it compares against come from ``mpiexec -n P tests/axis/mpi_results.py``,
found through ``$JSS_AXIS_MPI_DIR`` (``mpi{P}.npz``).
"""

from __future__ import annotations

import functools
import os
import sys

import pytest

if "xla_force_host_platform_device_count=8" not in os.environ.get("XLA_FLAGS", ""):
    pytest.skip("needs XLA_FLAGS=--xla_force_host_platform_device_count=8 before JAX starts "
                "(run through tests/test_axis_transport.py)", allow_module_level=True)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from common import (ALGORITHMS, CAP, N, PATTERNS, device_copies, fit, ladder, lg,  # noqa: E402
                    make_pattern, mpi_results, replicated_trainer)
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
from reference import (ef_shared_support_sgd_reference, ef_topk_sgd_reference,  # noqa: E402
                       ef_union_topk_sgd_reference,
                       hash_owner_reference, sparse_allreduce_reference)

import jax_sparse_sync as jss  # noqa: E402
from jax_sparse_sync.planning import cost_model  # noqa: E402
from jax_sparse_sync._ext import ALGORITHM_IDS  # noqa: E402
from jax_sparse_sync.mesh.resize import resize_residuals  # noqa: E402
from jax_sparse_sync.mesh.sparse_allreduce import AXIS_ALGORITHMS  # noqa: E402
from jax_sparse_sync.transforms.shared_support_sync import random_offsets  # noqa: E402

SPARSE = [a for a in ALGORITHMS if a != "dense"]
HB = cost_model.HEADER_BYTES
CAP_PATTERNS = [p for p in PATTERNS if p != "k_equals_n"]  # capacity CAP


@functools.cache
def mesh_of(p: int, names=("data",), shape=None):
    return jax.make_mesh(shape or (p,), names, devices=jax.devices()[:p])


@functools.cache
def allreduce_fn(p, algorithm, check_vma=False, comm=None, replicated_out=False, **kw):
    """jit(shard_map(sparse_allreduce)) over the first p devices: rows in, rows out."""
    mesh = mesh_of(p)
    comm = comm or jss.axis("data")

    def body(v, i):
        out, stats = jss.sparse_allreduce(v[0], i[0], size=N, algorithm=algorithm, comm=comm,
                                          return_stats="vector", **kw)
        return (out if replicated_out else out[None]), stats[None]

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("data"), P("data")),
                              out_specs=(P() if replicated_out else P("data"), P("data")),
                              check_vma=check_vma))
    rows = NamedSharding(mesh, P("data"))
    return lambda v, i: tuple(np.asarray(x) for x in f(jax.device_put(v, rows),
                                                         jax.device_put(i, rows)))


def stacked(pattern, p, **kw):
    inputs = [make_pattern(pattern, r, p, **kw) for r in range(p)]
    return inputs, np.stack([v for v, _ in inputs]), np.stack([i for _, i in inputs])


def assert_rows_identical(out):
    for r in range(1, out.shape[0]):
        assert out[r].tobytes() == out[0].tobytes(), f"device {r} differs from device 0"


# ---- the expected byte counts, restated from the jax_sparse_sync/axis/sparse_allreduce.py docstring ---------------------------
# (lg, ladder and fit: tests/axis/common.py)
def message(width, wire=0):
    """Bytes of an exchanged block of ``width`` slots: int32 indices, then float32 values
    (``wire`` 0) or 16-bit values two to an int32 word (1, 2)."""
    return 8 * width if wire == 0 else 4 * (width + (width + 1) // 2)


def split_expect(inputs, p, cap, dense_phase, wire=0):
    """(bytes sent per device, messages, switched_to_dense) of the split algorithms."""
    vb = 4 if wire == 0 else 2
    n = N
    bounds = [n * q // p for q in range(p + 1)]
    lmax = max(bounds[q + 1] - bounds[q] for q in range(p))
    uniq = [np.unique(i[i >= 0]) for _, i in inputs]
    max_slice = max(np.count_nonzero((u >= bounds[q]) & (u < bounds[q + 1]))
                    for u in uniq for q in range(p))
    s = fit(max_slice, ladder(cap, -(-cap // p)))
    sent = HB * (p - 1) + message(s, wire) * (p - 1)
    msgs = lg(p) + (p - 1)
    if dense_phase:
        return sent + (p - 1) * vb * lmax, msgs + lg(p), 1
    union = np.unique(np.concatenate(uniq))
    merged = max(np.count_nonzero((union >= bounds[q]) & (union < bounds[q + 1])) for q in range(p))
    hi = min(p * cap, lmax * vb // (4 + vb))
    dense = merged > hi
    block = vb * lmax if dense else message(fit(merged, ladder(hi, -(-cap // p))), wire)
    return sent + 4 * (p - 1) + (p - 1) * block, msgs + 2 * lg(p), int(dense)


def hash_expect(inputs, p, cap, wire=0):
    """(bytes sent per device, messages, switched_to_dense) of hash_partition."""
    uniq = [np.unique(i[i >= 0]) for _, i in inputs]
    max_slice = max(int(np.bincount(hash_owner_reference(u, p), minlength=p).max()) if len(u)
                    else 0 for u in uniq)
    sent = HB * (p - 1) + message(fit(max_slice, ladder(cap, -(-cap // p))), wire) * (p - 1)
    union = np.unique(np.concatenate(uniq))
    merged = int(np.bincount(hash_owner_reference(union, p), minlength=p).max()) if len(union) else 0
    block = message(fit(merged, ladder(min(p * cap, N), -(-cap // p))), wire)
    return sent + 4 * (p - 1) + (p - 1) * block, lg(p) + (p - 1) + 2 * lg(p), 0


def rd_expect(inputs, p, cap, n=N):
    """Per-rank (sent, received, messages) of recursive doubling and switched_to_dense,
    by replaying the algorithm on index sets."""
    delta, p2 = n // 2, 1 << (p.bit_length() - 1)
    extra = p - p2
    sent, recv, msgs = [HB * (p - 1)] * p, [HB * (p - 1)] * p, [lg(p)] * p
    streams = [set(np.unique(i[i >= 0]).tolist()) for _, i in inputs]
    state = {"dense": False, "c": cap}

    def exchange(perm, c_next):
        need = max(len(streams[s]) for s, _ in perm)
        if not state["dense"]:  # the counts' all_gather (once dense, no counts are needed)
            for r in range(p):
                sent[r] += 4 * (p - 1)
                recv[r] += 4 * (p - 1)
                msgs[r] += lg(p)
        state["dense"] |= need > delta
        nbytes = 4 * n if state["dense"] else 8 * fit(need, ladder(min(state["c"], delta),
                                                                   -(-cap // 2)))
        for s, d in perm:
            sent[s] += nbytes
            recv[d] += nbytes
            msgs[s] += 1
        state["c"] = c_next

    if extra:
        exchange([(p2 + i, i) for i in range(extra)], min(2 * cap, n))
        for i in range(extra):
            streams[i] |= streams[p2 + i]
    mask = 1
    while mask < p2:
        exchange([(i, i ^ mask) for i in range(p2)], min(2 * state["c"], n))
        streams[:p2] = [streams[i] | streams[i ^ mask] for i in range(p2)]
        mask <<= 1
    if extra:
        exchange([(i, p2 + i) for i in range(extra)], state["c"])
    return sent, recv, msgs, int(state["dense"] or len(streams[0]) > delta)


# ---- results: reference, MPI, identical devices ----------------------------------------------
CASES = ([(3, a) for a in ALGORITHMS] + [(8, a) for a in ALGORITHMS]
         + [(6, "recursive_doubling"), (6, "split_allgather")])


@pytest.mark.parametrize("p,algorithm", CASES)
def test_matches_reference_and_mpi_and_devices_agree(p, algorithm):
    fn = allreduce_fn(p, algorithm)
    mpi = mpi_results(p)
    for pattern in CAP_PATTERNS:
        inputs, v, i = stacked(pattern, p)
        out, stats = fn(v, i)
        ref = sparse_allreduce_reference(inputs, N)
        np.testing.assert_allclose(out[0], ref, rtol=1e-5, atol=1e-5, err_msg=pattern)
        assert_rows_identical(out)
        assert (stats[:, 3] == np.count_nonzero(out[0])).all(), pattern
        assert (stats[:, 5] == ALGORITHM_IDS[algorithm]).all()
        assert stats[:, 0].sum() == stats[:, 1].sum(), (pattern, stats)  # every byte sent arrives
        if algorithm == "dense":
            vol = cost_model.wire_volume("dense", nranks=p, size=N, k=CAP)
            assert (stats[:, 0] == vol.bytes_max).all() and (stats[:, 2] == vol.messages).all()
        elif algorithm == "allgather":
            nnz = max(len(np.unique(i[i >= 0])) for _, i in inputs)
            width = fit(nnz, ladder(CAP, -(-CAP // 4)))  # padding slots need not travel
            assert (stats[:, 0] == HB * (p - 1) + 8 * width * (p - 1)).all(), pattern
            vol = cost_model.wire_volume("allgather", nranks=p, size=N, k=nnz)
            assert (stats[:, 2] == vol.messages).all()
            if nnz == CAP:  # every slot full (jss.topk): exactly the cost model
                assert (stats[:, 0] == vol.bytes_max).all()
        elif algorithm == "hash_partition":
            sent, msgs, dense = hash_expect(inputs, p, CAP)
            assert (stats[:, 0] == sent).all(), (pattern, stats[:, 0], sent)
            assert (stats[:, 2] == msgs).all() and (stats[:, 4] == dense).all(), pattern
        elif algorithm == "recursive_doubling":
            sent, recv, msgs, dense = rd_expect(inputs, p, CAP)
            assert stats[:, 0].tolist() == sent and stats[:, 1].tolist() == recv, pattern
            assert stats[:, 2].tolist() == msgs and (stats[:, 4] == dense).all(), pattern
        else:
            sent, msgs, dense = split_expect(inputs, p, CAP, algorithm == "dsar_split_allgather")
            assert (stats[:, 0] == sent).all(), (pattern, stats[:, 0], sent)
            assert (stats[:, 2] == msgs).all() and (stats[:, 4] == dense).all(), pattern
        if mpi is not None:
            theirs = mpi[f"{algorithm}/{pattern}/out"]
            if algorithm == "dense":  # XLA's and MPI's reduction orders may differ
                np.testing.assert_allclose(out[0], theirs, rtol=1e-6, atol=1e-6)
            else:
                assert out[0].tobytes() == theirs.tobytes(), f"{pattern}: differs from MPI"
            assert (mpi[f"{algorithm}/{pattern}/stats"][:, 3] == stats[:, 3]).all()


@pytest.mark.parametrize("algorithm", ["recursive_doubling", "split_allgather", "hash_partition"])
def test_k_equals_n_and_mpi(algorithm):
    p = 8
    inputs, v, i = stacked("k_equals_n", p)
    out, stats = allreduce_fn(p, algorithm)(v, i)
    np.testing.assert_allclose(out[0], sparse_allreduce_reference(inputs, N), rtol=1e-5, atol=1e-5)
    assert_rows_identical(out)
    if algorithm in ("recursive_doubling", "split_allgather", "dsar_split_allgather"):
        assert (stats[:, 4] == 1).all()  # past N/2: travels dense
    mpi = mpi_results(p)
    if mpi is not None and algorithm != "dense":
        assert out[0].tobytes() == mpi[f"{algorithm}/k_equals_n/out"].tobytes()


# ---- capacities: the fallbacks, exercised on purpose -----------------------------------------
def test_split_capacities_follow_the_data_and_fall_back_to_dense():
    p = 8
    sizes = {}
    for pattern in ("same", "random", "skewed", "disjoint"):
        inputs, v, i = stacked(pattern, p)
        out, stats = allreduce_fn(p, "split_allgather")(v, i)
        np.testing.assert_allclose(out[0], sparse_allreduce_reference(inputs, N), rtol=1e-5,
                                   atol=1e-5)
        assert_rows_identical(out)
        sent, _, dense = split_expect(inputs, p, CAP, False)
        assert (stats[:, 0] == sent).all() and (stats[:, 4] == dense).all()
        sizes[pattern] = (int(stats[0, 0]), dense)
    # full overlap: small slices, small ranges. Skewed to owner 0: slices up to the bound
    # (cap), and more than half of owner 0's range: the dense phase-2 fallback.
    assert sizes["same"][0] < sizes["random"][0] < sizes["skewed"][0]
    assert sizes["same"][1] == sizes["random"][1] == 0
    assert sizes["skewed"][1] == sizes["disjoint"][1] == 1


def test_recursive_doubling_goes_dense_when_streams_pass_n_over_2():
    p, cap = 8, 600  # ~600, ~1200 entries travel sparse; ~2200 > N/2 = 2048: dense
    inputs = [make_pattern("random", r, p, cap=cap) for r in range(p)]
    v, i = np.stack([a for a, _ in inputs]), np.stack([b for _, b in inputs])
    out, stats = allreduce_fn(p, "recursive_doubling")(v, i)
    np.testing.assert_allclose(out[0], sparse_allreduce_reference(inputs, N), rtol=1e-5, atol=1e-5)
    assert_rows_identical(out)
    sent, recv, _, dense = rd_expect(inputs, p, cap)
    assert dense == 1 and (stats[:, 4] == 1).all()
    assert stats[:, 0].tolist() == sent and stats[:, 1].tolist() == recv
    assert stats[0, 0] == HB * 7 + 3 * 4 * 7 + 8 * 600 + 8 * 1200 + 4 * N
    mpi_like = cost_model.wire_volume("recursive_doubling", nranks=p, size=N, k=cap)
    assert mpi_like.bytes_min <= stats[0, 0] <= mpi_like.bytes_max + 3 * 4 * 7


def test_hash_partition_is_balanced_where_split_ranges_are_not():
    # "skewed": every device's entries in owner 0's contiguous range. split_allgather
    # needs the largest phase-1 slice (cap) and sends owner 0's range dense; the hash
    # spreads the same support over all owners.
    p = 8
    inputs, v, i = stacked("skewed", p)
    hashed = allreduce_fn(p, "hash_partition")(v, i)
    split = allreduce_fn(p, "split_allgather")(v, i)
    assert hashed[0][0].tobytes() == split[0][0].tobytes()  # same sums, same order
    assert hashed[1][0, 0] < split[1][0, 0], (hashed[1][0, 0], split[1][0, 0])
    union = np.unique(np.concatenate([b[b >= 0] for _, b in inputs]))
    shares = np.bincount(hash_owner_reference(union, p), minlength=p)
    assert shares.max() <= 1.5 * shares.mean(), shares


# ---- variants: check_vma, pmap, several axes, empty input, QSGD, auto ------------------------
@pytest.mark.parametrize("algorithm", ["dense", "dsar_split_allgather", "hash_partition"])
def test_check_vma_results_are_typed_replicated(algorithm):
    p = 8
    inputs, v, i = stacked("random", p)
    out, _ = allreduce_fn(p, algorithm, check_vma=True, replicated_out=True)(v, i)
    ref_out, _ = allreduce_fn(p, algorithm)(v, i)
    assert out.tobytes() == ref_out[0].tobytes()


def test_check_vma_recursive_doubling_is_typed_varying_but_identical():
    p = 8
    inputs, v, i = stacked("random", p)
    out, _ = allreduce_fn(p, "recursive_doubling", check_vma=True)(v, i)
    assert_rows_identical(out)
    np.testing.assert_allclose(out[0], sparse_allreduce_reference(inputs, N), rtol=1e-5, atol=1e-5)


def test_pmap_equals_shard_map():
    p = 8
    inputs, v, i = stacked("random", p)
    for algorithm in ("split_allgather",):  # recursive doubling: test_pmap_step_equals_...
        f = jax.pmap(lambda a, b, al=algorithm: jss.sparse_allreduce(
            a, b, size=N, algorithm=al, comm=jss.axis("data")), axis_name="data")
        out = np.asarray(f(v, i))
        assert out.tobytes() == allreduce_fn(p, algorithm)(v, i)[0].tobytes(), algorithm


def test_several_mesh_axes_as_one_communicator():
    mesh = mesh_of(8, ("x", "y"), (2, 4))
    inputs, v, i = stacked("random", 8)
    for algorithm in ("recursive_doubling", "split_allgather"):
        def body(a, b, algorithm=algorithm):
            return jss.sparse_allreduce(a.reshape(-1), b.reshape(-1), size=N, algorithm=algorithm,
                                        comm=jss.axis(("x", "y")))[None, None]
        f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("x", "y"), P("x", "y")),
                                  out_specs=P("x", "y"), check_vma=False))
        rows = NamedSharding(mesh, P("x", "y"))
        out = np.asarray(f(jax.device_put(v.reshape(2, 4, -1), rows),
                           jax.device_put(i.reshape(2, 4, -1), rows))).reshape(8, N)
        assert out[0].tobytes() == allreduce_fn(8, algorithm)(v, i)[0][0].tobytes(), algorithm
        assert_rows_identical(out)


@pytest.mark.parametrize("algorithm", ["recursive_doubling", "split_allgather", "hash_partition"])
def test_empty_contribution(algorithm):
    p = 3
    v, i = np.zeros((p, 0), np.float32), np.zeros((p, 0), np.int32)
    out, stats = allreduce_fn(p, algorithm)(v, i)
    assert out.shape == (p, N) and not out.any() and (stats[:, 3] == 0).all()


@pytest.mark.parametrize("bits", [4])
def test_dsar_qsgd_identical_and_within_one_step(bits):
    p, bucket = 8, 256
    inputs, v, i = stacked("random", p)
    f = allreduce_fn(p, "dsar_split_allgather", quantize_bits=bits, qsgd_bucket=bucket)
    out, stats = f(v, i)
    assert_rows_identical(out)
    ref = sparse_allreduce_reference(inputs, N)
    levels = 2 ** (bits - 1) - 1
    for lo in range(0, N, bucket):  # N/P = 512 is a multiple of the bucket
        step = np.abs(ref[lo:lo + bucket]).max() / levels
        assert np.all(np.abs(out[0, lo:lo + bucket] - ref[lo:lo + bucket]) <= step * (1 + 1e-5) + 1e-6)
    lmax = N // p
    block = (lmax * bits + 7) // 8 + 4 * -(-lmax // bucket)
    sent, _, _ = split_expect(inputs, p, CAP, True)
    assert (stats[:, 0] == sent - 7 * 4 * lmax + 7 * block).all()


def test_auto_picks_by_the_cost_model_and_is_correct():
    p = 8
    inputs, v, i = stacked("random", p)
    out, stats = allreduce_fn(p, "auto")(v, i)
    expect = min(AXIS_ALGORITHMS, key=lambda a: cost_model.predict_time(a, nranks=p, size=N, k=CAP))
    assert (stats[:, 5] == ALGORITHM_IDS[expect]).all()
    np.testing.assert_allclose(out[0], sparse_allreduce_reference(inputs, N), rtol=1e-5, atol=1e-5)


# ---- errors: named, raised on every device, never a hang --------------------------------------
def test_unbound_axis_name_is_named():
    with pytest.raises(NameError, match=r"`comm` is jss.axis\('data'\), but no mesh axis named "
                                        r"'data' is bound here"):
        jss.sparse_allreduce(jnp.ones(2), jnp.arange(2, dtype=jnp.int32), size=4,
                             comm=jss.axis("data"))
    mesh = mesh_of(3)
    f = jax.shard_map(lambda a: jss.sparse_allreduce(a, jnp.arange(1, dtype=jnp.int32), size=4,
                                                     comm=jss.axis("model")),
                      mesh=mesh, in_specs=P(), out_specs=P(), check_vma=False)
    with pytest.raises(NameError, match="no mesh axis named 'model'"):
        jax.jit(f)(jnp.ones(1))
    tx = jss.topk_sync(k=1, comm=jss.axis("data"))
    with pytest.raises(NameError, match="no mesh axis named 'data'"):
        tx.update({"w": jnp.ones(3)}, tx.init({"w": jnp.ones(3)}))


def test_bad_arguments_same_messages_as_mpi():
    for bad, exc, match in [
        (dict(values=jnp.ones(2, jnp.int32)), TypeError, "`values` has dtype int32"),
        (dict(indices=jnp.ones(2, jnp.float32)), TypeError, "`indices` has dtype float32"),
        (dict(values=jnp.ones(3)), ValueError, "same length"),
        (dict(algorithm="ring"), ValueError, "unknown `algorithm` 'ring'"),
        (dict(nan_policy="x"), ValueError, "`nan_policy`"),
        (dict(quantize_bits=4, algorithm="allgather"), ValueError, "needs algorithm='dsar_split"),
    ]:
        kw = dict(values=jnp.ones(2), indices=jnp.arange(2, dtype=jnp.int32), size=4,
                  algorithm="allgather") | bad
        values, indices = kw.pop("values"), kw.pop("indices")
        with pytest.raises(exc, match=match):  # MPI
            jss.sparse_allreduce(values, indices, **kw)
        with pytest.raises(exc, match=match):  # mesh axis, same message
            jax.shard_map(lambda _: jss.sparse_allreduce(values, indices, comm=jss.axis("data"),
                                                         **kw),
                          mesh=mesh_of(3), in_specs=P(), out_specs=P(),
                          check_vma=False)(jnp.zeros(()))
    with pytest.raises(TypeError, match="`name` must be a mesh axis name"):
        jss.axis(3)
    with pytest.raises(TypeError, match=r"sparse_allreduce_start runs over MPI only"):
        jss.sparse_allreduce_start(jnp.ones(2), jnp.arange(2, dtype=jnp.int32), size=4,
                                   comm=jss.axis("data"))


def _run_with(p, algorithm, v, i, **kw):
    return allreduce_fn(p, algorithm, **kw)(v, i)


@pytest.mark.parametrize("algorithm", ["dense", "recursive_doubling", "split_allgather"])
def test_index_out_of_range_raises_on_every_device_then_works(algorithm):
    p = 8
    _, v, i = stacked("random", p)
    i = i.copy()
    i[p - 1, 1] = 5000
    with pytest.raises(Exception, match=rf"`indices` out of range on rank {p - 1}: "
                                        r"indices\[1\] = 5000 is not in \[0, size=4096\)"):
        _run_with(p, algorithm, v, i)
    inputs, v, i = stacked("random", p)
    out, _ = _run_with(p, algorithm, v, i)
    np.testing.assert_allclose(out[0], sparse_allreduce_reference(inputs, N), rtol=1e-5, atol=1e-5)


def test_nan_raises_on_every_device_and_propagate_sums_it():
    p = 8
    _, v, i = stacked("random", p)
    v = v.copy()
    v[0, 3] = np.nan
    v[5, 0] = np.inf
    with pytest.raises(Exception, match=r"non-finite \(NaN or Inf\) entries in `values` on "
                                        r"rank\(s\) 0, 5"):
        _run_with(p, "allgather", v, i)
    out, _ = _run_with(p, "allgather", v, i, nan_policy="propagate")
    assert np.isnan(out[0, i[0, 3]]) and np.isinf(out[0, i[5, 0]])


# ---- Optax: topk_sync and dense_sync in a shard_map-ped / pmap-ped train step ----------------
DIM, K, LR = 120, 6, 0.2


def targets(p):
    return np.random.default_rng(5).standard_normal((p, DIM)).astype(np.float32)


def grad_fn(w, t, step):
    return (w - t) * (1 + step % 3).astype(jnp.float32)


@functools.cache
def shard_map_trainer(p, sync, check_vma=False):
    return replicated_trainer(mesh_of(p), optax.chain(sync, optax.sgd(LR)), grad_fn, targets(p),
                              DIM, check_vma)


@pytest.mark.parametrize("p,algorithm,check_vma", [(8, "allgather", True),
                                                   (8, "recursive_doubling", False),
                                                   (3, "split_allgather", True),
                                                   (6, "dsar_split_allgather", False),
                                                   (8, "hash_partition", True)])
def test_topk_sync_matches_numpy_ef_sgd_and_replicas_stay_identical(p, algorithm, check_vma):
    steps = 8
    sync = jss.topk_sync(k=K, algorithm=algorithm, comm=jss.axis("data"))
    w, state = shard_map_trainer(p, sync, check_vma)(steps)
    copies = device_copies(w)  # each device's own buffer of the replicated parameters
    assert len(copies) == p and all(c.tobytes() == copies[0].tobytes() for c in copies)
    t = targets(p)
    fns = [lambda w_, s, r=r: (w_ - t[r]) * np.float32(1 + s % 3) for r in range(p)]
    ref_w, ref_res = ef_topk_sgd_reference(np.zeros(DIM, np.float32), fns, K, LR, steps)
    np.testing.assert_allclose(copies[0], ref_w, rtol=1e-5, atol=1e-6)
    residual = np.asarray(state[0].residual)  # [P, DIM]: one residual per device
    assert residual.shape == (p, DIM)
    np.testing.assert_allclose(residual, np.stack(ref_res), rtol=1e-5, atol=1e-6)
    assert np.asarray(state[0].count).tolist() == [steps] * p
    stats = np.asarray(state[0].last_stats)
    assert (stats[:, 5] == ALGORITHM_IDS[algorithm]).all()


@pytest.mark.parametrize("check_vma", [True, False])
def test_topk_sync_warmup_in_shard_map_matches_numpy(check_vma):
    # dense for 2 steps, 25% for 2, then K: the phases' lax.switch around JAX collectives
    p, steps = 4, 7
    sync = jss.topk_sync(k=K, algorithm="allgather", comm=jss.axis("data"),
                         warmup=[(2, 1.0), (2, 0.25)])
    w, state = shard_map_trainer(p, sync, check_vma)(steps)
    copies = device_copies(w)
    assert all(c.tobytes() == copies[0].tobytes() for c in copies)
    t = targets(p)
    fns = [lambda w_, s, r=r: (w_ - t[r]) * np.float32(1 + s % 3) for r in range(p)]
    k_at = lambda s: DIM if s < 2 else (round(0.25 * DIM) if s < 4 else K)  # noqa: E731
    ref_w, ref_res = ef_topk_sgd_reference(np.zeros(DIM, np.float32), fns, k_at, LR, steps)
    np.testing.assert_allclose(copies[0], ref_w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(state[0].residual), np.stack(ref_res), rtol=1e-5,
                               atol=1e-6)


@pytest.mark.parametrize("check_vma", [True, False])
def test_topk_sync_union_in_shard_map_matches_numpy(check_vma):
    # every device's top-k, the union summed by a psum; replicas identical
    p, steps = 4, 6
    sync = jss.topk_sync(k=K, algorithm="allgather", selection="union", comm=jss.axis("data"))
    w, state = shard_map_trainer(p, sync, check_vma)(steps)
    copies = device_copies(w)
    assert all(c.tobytes() == copies[0].tobytes() for c in copies)
    t = targets(p)
    fns = [lambda w_, s, r=r: (w_ - t[r]) * np.float32(1 + s % 3) for r in range(p)]
    ref_w, ref_res, union = ef_union_topk_sgd_reference(np.zeros(DIM, np.float32), fns, K, LR,
                                                        steps)
    np.testing.assert_allclose(copies[0], ref_w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(state[0].residual), np.stack(ref_res), rtol=1e-5,
                               atol=1e-6)
    assert K < union.size and (np.asarray(state[0].last_stats)[:, 3] == union.size).all()


@pytest.mark.parametrize("random_fraction", [0.0, 0.5])
def test_shared_support_sync_in_shard_map_matches_numpy(random_fraction, check_vma=False):
    # refresh steps: the sparse allreduce; the others: one psum of K values on the support
    # (and, with random_fraction, on coordinates drawn by the shared seed and step)
    p, steps, refresh = 4, 7, 3
    sync = jss.shared_support_sync(k=K, refresh_every=refresh, algorithm="allgather",
                                   random_fraction=random_fraction, seed=2,
                                   comm=jss.axis("data"))
    # check_vma types the per-device support as varying: refused with the fix
    with pytest.raises(ValueError, match="check_vma=False"):
        shard_map_trainer(p, sync, True)(1)
    w, state = shard_map_trainer(p, sync, check_vma)(steps)
    copies = device_copies(w)
    assert all(c.tobytes() == copies[0].tobytes() for c in copies)
    t = targets(p)
    fns = [lambda w_, s, r=r: (w_ - t[r]) * np.float32(1 + s % 3) for r in range(p)]
    ref_w, ref_res, ref_support = ef_shared_support_sgd_reference(
        np.zeros(DIM, np.float32), fns, K, LR, steps, refresh, random_fraction,
        lambda step, m, r: np.asarray(random_offsets(2, jnp.int32(step), m, r)))
    np.testing.assert_allclose(copies[0], ref_w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(state[0].residual), np.stack(ref_res), rtol=1e-5,
                               atol=1e-6)
    assert (np.asarray(state[0].support) == ref_support).all()
    stats = np.asarray(state[0].last_stats)  # step 6 was a refresh; step 5 a shared step
    _, shared = shard_map_trainer(p, sync, check_vma)(steps - 1)
    shared_stats = np.asarray(shared[0].last_stats)
    assert (shared_stats[:, 3] == K).all() and (shared_stats[:, 0] < stats[:, 0]).all()


def test_dense_sync_in_shard_map_is_mean_gradient_sgd():
    p, steps = 8, 4
    w, state = shard_map_trainer(p, jss.dense_sync(comm=jss.axis("data")), True)(steps)
    copies = device_copies(w)
    assert all(c.tobytes() == copies[0].tobytes() for c in copies)
    t, ref = targets(p), np.zeros(DIM, np.float32)
    for s in range(steps):
        ref = ref - LR * np.mean([(ref - t[r]) * (1 + s % 3) for r in range(p)], axis=0)
    np.testing.assert_allclose(copies[0], ref, rtol=1e-5, atol=1e-6)
    vol = cost_model.wire_volume("dense", nranks=p, size=DIM, k=DIM)
    assert (np.asarray(state[0].last_stats)[:, 0] == vol.bytes_max).all()


def test_adam_direction_sync_under_check_vma_equals_without():
    # the CPU kernel's outputs are typed varying like its inputs (else platform_dependent's
    # branches disagree under check_vma); same parameters bit for bit either way
    p, steps = 4, 4
    sync = jss.adam_direction_sync(jss.topk_sync(k=K, algorithm="allgather",
                                                 comm=jss.axis("data")))
    w_checked, _ = shard_map_trainer(p, sync, True)(steps)
    w_plain, _ = shard_map_trainer(p, sync, False)(steps)
    copies = device_copies(w_checked)
    assert all(c.tobytes() == copies[0].tobytes() for c in copies)
    assert copies[0].tobytes() == device_copies(w_plain)[0].tobytes()
    assert np.abs(copies[0]).max() > 0


@pytest.mark.parametrize("CHECK", [False, True])
def test_adam_direction_mean_moment_in_shard_map_needs_nranks_and_matches_numpy(CHECK):
    # second_moment="mean" under shard_map: without nranks P cannot be read from the
    # mesh, so it is refused with the fix; with it, the update is the devices' mean of
    # each device's direction (mean_moment_pass per device, here one device at a time)
    from jax_sparse_sync.transforms import adam_pass
    p, steps = 8, 5
    dense = jss.dense_sync(comm=jss.axis("data"))
    with pytest.raises(ValueError, match=r"nranks=mesh.shape\['data'\]"):
        shard_map_trainer(p, jss.adam_direction_sync(dense, second_moment="mean"), CHECK)(1)
    sync = jss.adam_direction_sync(dense, second_moment="mean", nranks=p)
    w, state = shard_map_trainer(p, sync, CHECK)(steps)
    copies = device_copies(w)
    assert all(c.tobytes() == copies[0].tobytes() for c in copies)
    t, ref = targets(p), np.zeros(DIM, np.float32)
    zero = jnp.zeros(DIM)
    per_device = [[zero, zero, (zero, zero, zero), zero] for _ in range(p)]
    for s in range(steps):
        dirs = []
        for r in range(p):
            mu, nu, noise, age = per_device[r]
            g = (ref - t[r]) * np.float32(1 + s % 3)
            mu, nu, noise, age, d = adam_pass.mean_moment_pass(
                {"w": jnp.asarray(g)}, mu, nu, noise, age, None, jnp.int32(s + 1), b1=0.9,
                b2=0.999, eps=1e-8, masking="restart", nranks=p)
            per_device[r] = [mu, nu, noise, age]
            dirs.append(np.asarray(d))
        ref = ref - np.float32(LR) * np.mean(dirs, axis=0)
    np.testing.assert_allclose(copies[0], ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(state[0].noise[0]),
                               np.stack([np.asarray(d[2][0]) for d in per_device]),
                               rtol=1e-5, atol=1e-9)


def test_pmap_step_equals_shard_map_step():
    p, steps = 8, 5
    sync = jss.topk_sync(k=K, algorithm="recursive_doubling", comm=jss.axis("data"))
    w_sm, state_sm = shard_map_trainer(p, sync)(steps)
    tx = optax.chain(sync, optax.sgd(LR))

    @functools.partial(jax.pmap, axis_name="data", in_axes=(0, 0, 0, None))
    def step(w, state, t, i):
        updates, state = tx.update({"w": grad_fn(w, t, i)}, state, {"w": w})
        return w + updates["w"], state

    w = jnp.zeros((p, DIM), jnp.float32)
    state = jax.pmap(lambda x: tx.init({"w": x}))(w)
    for s in range(steps):
        w, state = step(w, state, targets(p), jnp.int32(s))
    w = np.asarray(w)
    assert all(w[r].tobytes() == w[0].tobytes() for r in range(p))
    assert w[0].tobytes() == device_copies(w_sm)[0].tobytes()
    assert np.asarray(state[0].residual).tobytes() == \
        np.asarray(state_sm[0].residual).tobytes()


def test_checkpoint_restore_continues_exactly_and_resize_keeps_what_is_owed():
    p = 8
    sync = jss.topk_sync(k=K, algorithm="allgather", comm=jss.axis("data"))
    train = shard_map_trainer(p, sync, True)
    w, state = train(3)
    saved_w = np.asarray(device_copies(w)[0])
    saved_state = jax.tree_util.tree_map(np.asarray, state)  # what a checkpoint holds
    w_a, state_a = train(2, w, state, start=3)
    rows = NamedSharding(mesh_of(p), P("data"))
    restored = jax.tree_util.tree_map(lambda x: jax.device_put(x, rows), saved_state)
    w_b, state_b = train(2, saved_w, restored, start=3)
    assert device_copies(w_a)[0].tobytes() == device_copies(w_b)[0].tobytes()
    # 8 -> 3 devices: each new device gets the mean residual; the owed update is unchanged
    res = saved_state[0].residual  # (P, N): one flat residual per device (N = DIM here)
    new = resize_residuals(res, 3)
    assert new.shape == (3, DIM)
    np.testing.assert_allclose(np.asarray(new).sum(0) / 3, res.sum(0) / p, rtol=1e-5,
                               atol=1e-7)


# ---- jss.dense_allreduce on the axis: one psum, no index array -------------------------

@pytest.mark.parametrize("p", [3, 8])
def test_dense_allreduce_is_one_psum_with_mpis_byte_counts(p):
    mesh = mesh_of(p)
    rng = np.random.default_rng(p)
    x = (rng.standard_normal((p, 1001)) * 10.0 ** rng.uniform(-3, 3, (p, 1001))).astype(np.float32)

    def body(v):
        out, stats = jss.dense_allreduce(v[0], comm=jss.axis("data"), return_stats="vector")
        return out[None], stats[None]

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("data"), out_specs=(P("data"),) * 2))
    rows = jax.device_put(x, NamedSharding(mesh, P("data")))
    text = f.lower(rows).as_text()
    # no index array, no scatter into the vector (the 14-word header is built with one)
    assert "1001xi32" not in text
    assert not [line for line in text.splitlines() if "scatter" in line and "1001xf32" in line]
    out, stats = (np.asarray(a) for a in f(rows))
    assert_rows_identical(out)
    np.testing.assert_allclose(out[0], x.astype(np.float64).sum(0), rtol=1e-5,
                               atol=1e-6 * np.abs(x).sum(0).max())
    vol = cost_model.wire_volume("dense", nranks=p, size=1001, k=1001)
    assert (stats[:, 0] == vol.bytes_max).all() and (stats[:, 2] == vol.messages).all()
    assert (stats[:, 3] == 1001).all() and (stats[:, 5] == ALGORITHM_IDS["dense"]).all()
    x[p - 1, 5] = np.nan

    def raising(v):
        return jss.dense_allreduce(v[0], comm=jss.axis("data"), nan_policy="raise")[None]

    g = jax.jit(jax.shard_map(raising, mesh=mesh, in_specs=P("data"), out_specs=P("data")))
    with pytest.raises(Exception, match=rf"dense_allreduce: non-finite .* rank\(s\) {p - 1}\."):
        jax.block_until_ready(g(jax.device_put(x, NamedSharding(mesh, P("data")))))


@pytest.mark.parametrize("check_vma", [False, True])
@pytest.mark.parametrize("wire", [jnp.bfloat16, jnp.float16])
def test_dense_allreduce_on_a_16bit_wire_matches_the_mpi_arithmetic(wire, check_vma):
    # each input rounded to the wire dtype, summed in float32 in device order, rounded once
    p, n = 3, 1001
    mesh = mesh_of(p)
    x = np.random.default_rng(7).standard_normal((p, n)).astype(np.float32)

    def body(v):
        out, stats = jss.dense_allreduce(v[0], comm=jss.axis("data"), wire_dtype=wire,
                                         return_stats="vector")
        return out[None], stats[None]

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("data"), out_specs=(P("data"),) * 2,
                              check_vma=check_vma))
    out, stats = (np.asarray(a) for a in f(jax.device_put(x, NamedSharding(mesh, P("data")))))
    assert_rows_identical(out)
    rounded = np.asarray(jnp.asarray(x).astype(wire).astype(jnp.float32))
    total = rounded[0]
    for r in range(1, p):
        total = (total + rounded[r]).astype(np.float32)
    np.testing.assert_array_equal(out[0], np.asarray(jnp.asarray(total).astype(wire)
                                                     .astype(jnp.float32)))
    block = -(-n // p)
    assert (stats[:, 0] == HB * (p - 1) + 2 * (p - 1) * block * 2).all()


# ---- 16-bit values on the wire (wire_dtype) --------------------------------------------------
@pytest.mark.parametrize("p,wire", [(3, jnp.bfloat16), (8, jnp.float16)])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("pattern", ["random", "same", "skewed", "uneven"])
def test_16bit_values_within_rounding_identical_and_counted_exactly(p, algorithm, pattern, wire):
    inputs, v, i = stacked(pattern, p)
    out, stats = allreduce_fn(p, algorithm, wire_dtype=wire)(v, i)
    assert_rows_identical(out)
    ref = sparse_allreduce_reference(inputs, N)
    mags = sparse_allreduce_reference([(np.abs(a), b) for a, b in inputs], N)
    eps = 2.0**-8 if wire == jnp.bfloat16 else 2.0**-11
    bound = (lg(p) + 2) * eps * mags
    assert np.all(np.abs(out[0] - ref) <= bound), float(np.abs(out[0] - ref).max())
    wid = 1 if wire == jnp.bfloat16 else 2
    if algorithm == "allgather":
        nnz = max(len(np.unique(b[b >= 0])) for _, b in inputs)
        width = fit(nnz, ladder(CAP, -(-CAP // 4)))
        assert (stats[:, 0] == HB * (p - 1) + message(width, wid) * (p - 1)).all()
    elif algorithm == "hash_partition":
        assert (stats[:, 0] == hash_expect(inputs, p, CAP, wid)[0]).all()
    elif algorithm in ("split_allgather", "dsar_split_allgather"):
        sent, _, dense = split_expect(inputs, p, CAP, algorithm == "dsar_split_allgather", wid)
        assert (stats[:, 0] == sent).all() and (stats[:, 4] == dense).all()
    elif algorithm == "dense":
        vol = cost_model.wire_volume("dense", nranks=p, size=N, k=CAP, wire_dtype=wid)
        assert (stats[:, 0] == vol.bytes_max).all()
    else:  # recursive doubling: the float32 run's bytes, less 2 per value sent
        _, plain = allreduce_fn(p, algorithm)(v, i)
        assert (stats[:, 0] < plain[:, 0]).all() or (plain[:, 0] == HB * (p - 1)).all()
    assert stats[:, 0].sum() == stats[:, 1].sum()


def test_index_encoding_auto_is_mpi_only():
    with pytest.raises(ValueError, match="MPI only"):
        allreduce_fn(2, "allgather", index_encoding="auto")(*stacked("random", 2)[1:])
