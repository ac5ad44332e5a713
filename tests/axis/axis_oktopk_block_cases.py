"""Ok-Topk and block-sparse on the axis transport (8 host CPU devices), run by
test_axis_transport.py in the same subprocess as axis_cases.py.

Against the MPI transport's results (``mpiexec -n P tests/axis/mpi_results.py``,
found through ``$JSS_AXIS_MPI_DIR``) bit for bit, and against the NumPy
reference (tests/reference.py); byte counts restated from the module docs of
jax_sparse_sync/axis/oktopk.py and axis/block.py; oktopk_sync / block_sync in
shard_map-ped and pmap-ped train steps.
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
from common import (BLOCK_CASES, CAP, N, OKTOPK_WIRE_CASES, SYNC_DIM, SYNC_K,  # noqa: E402
                    SYNC_LR, SYNC_RUNS, SYNC_STEPS, block_input, device_copies, fit, ladder, lg,
                    make_pattern, mpi_results, oktopk_cases, replicated_trainer, sync_grad,
                    sync_targets)
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
from reference import (hash_owner_reference, oktopk_reference, oktopk_sgd_reference,  # noqa: E402
                       rank_order_sum,
                       sparse_allreduce_reference)

import jax_sparse_sync as jss  # noqa: E402
from jax_sparse_sync.planning import cost_model  # noqa: E402
from jax_sparse_sync._ext import ALGORITHM_IDS  # noqa: E402

HB = cost_model.HEADER_BYTES


@functools.cache
def mesh_of(p):
    return jax.make_mesh((p,), ("data",), devices=jax.devices()[:p])


def rows_of(p, x):
    return jax.device_put(np.asarray(x), NamedSharding(mesh_of(p), P("data")))


def identical_rows(x):
    x = np.asarray(x)
    return all(x[r].tobytes() == x[0].tobytes() for r in range(x.shape[0]))


# ---- byte counts, restated from the module docs (lg, ladder, fit: tests/axis/common.py) ---------
def oktopk_ladder(hi, typical):
    """axis_oktopk's capacities: halving from hi past typical/2, quarter steps between
    typical (k/P) and twice it."""
    rungs = set(ladder(hi, -(-typical // 2)))
    fine = {min(hi, -(-r * (4 + j) // 4)) for r in rungs if typical // 2 <= r <= 2 * typical
            for j in (1, 2, 3)}
    return sorted(rungs | {c for c in fine if typical <= c <= 2 * typical})


def oktopk_expect(inputs, p, k, bounds, result, recompute_b, recompute_t, cap=CAP, wire=0,
                  hashed=False):
    """(bytes each device sends, messages, balanced) of axis_oktopk_allreduce
    (``wire`` 1 or 2: 16-bit values, two to an int32 word beside the indices;
    ``hashed``: partition="hash", owner q holds the indices whose hash owner is q)."""
    def message(w):  # bytes of a message of w entries
        return 8 * w if wire == 0 else 4 * (w + (w + 1) // 2)

    def owned(ids, q):
        if hashed:
            return hash_owner_reference(ids, p) == q
        return (ids >= bounds[q]) & (ids < bounds[q + 1])

    sent, msgs = HB * (p - 1), lg(p)
    if recompute_b and p > 1 and not hashed:
        sent, msgs = sent + 4 * (p - 1) * (p - 1), msgs + lg(p)
    uniq = [np.unique(i[i >= 0]) for _, i in inputs]
    max_slice = max(np.count_nonzero(owned(u, q)) for u in uniq for q in range(p))
    sent += 4 * (p - 1) + (p - 1) * message(fit(max_slice, oktopk_ladder(cap, -(-k // p))))
    msgs += lg(p) + p - 1
    if recompute_t:
        sent += sum(2 * (p - 1) * 4 * b // p for b in cost_model.THRESHOLD_HISTOGRAM_BINS)
        msgs += 8 * lg(p)
    kept = np.flatnonzero(result)
    sizes = [np.count_nonzero(owned(kept, q)) for q in range(p)]
    total, largest = sum(sizes), max(sizes)
    balanced = total > 0 and largest * p > 4 * total
    top = min(p * cap, N)
    steps = oktopk_ladder(top, -(-k // p))
    sent += 4 * (p - 1)
    msgs += lg(p)
    if balanced:
        sent, msgs = sent + 2 * (p - 1) * message(fit(-(-total // p), steps)), msgs + lg(p) + p - 1
    else:
        sent, msgs = sent + (p - 1) * message(fit(largest, steps)), msgs + lg(p)
    return sent, msgs, int(balanced)


def block_expect(vectors, p, b):
    """(bytes each device sends, messages, switched) of axis_block_allreduce."""
    n = len(vectors[0])
    nb = -(-n // b)
    bmax = -(-nb // p)
    first = [nb * q // p for q in range(p + 1)]
    words = -(-bmax // 32)

    def nonzero_blocks(x):
        return np.flatnonzero(np.pad(x, (0, nb * b - n)).reshape(nb, b).any(1))

    def per_owner(ids):
        return [np.count_nonzero((ids >= first[q]) & (ids < first[q + 1])) for q in range(p)]

    steps = ladder(bmax, 1)

    def phase(need):
        w = fit(need, steps)
        return (4 * bmax * b if w == bmax else 4 * (words + w * b)) * (p - 1), w == bmax

    ph1, dense1 = phase(max(max(per_owner(nonzero_blocks(x))) for x in vectors))
    ph2, dense2 = phase(max(per_owner(nonzero_blocks(rank_order_sum(vectors)))))
    return HB * (p - 1) + ph1 + 4 * (p - 1) + ph2, 3 * lg(p) + p - 1, int(dense1 or dense2)


# ---- oktopk_allreduce: reference, MPI, devices, bytes ----------------------------------------
@functools.cache
@functools.lru_cache(maxsize=None)   # one jitted function per (P, k, counts): the cases share compiles
def oktopk_fn(p, k, region_counts=None, wire_dtype=None, partition="regions"):
    def body(v, i, b, thr, rb, rt):
        r = jss.oktopk_allreduce(v[0], i[0], size=N, k=k, boundaries=b, global_threshold=thr,
                                 recompute_boundaries=rb, recompute_threshold=rt,
                                 comm=jss.axis("data"), region_counts=region_counts,
                                 wire_dtype=wire_dtype, partition=partition)
        return (r.sum[None], r.contributed[None], r.boundaries[None], r.threshold[None],
                jnp.stack(r.stats)[None])

    f = jax.jit(jax.shard_map(body, mesh=mesh_of(p),
                              in_specs=(P("data"), P("data"), P(), P(), P(), P()),
                              out_specs=P("data"), check_vma=False))

    def run(inputs, boundaries=None, global_threshold=0.0, recompute_boundaries=True,
            recompute_threshold=True):
        b = [N * q // p for q in range(p + 1)] if boundaries is None else boundaries
        out = f(rows_of(p, [v for v, _ in inputs]), rows_of(p, [i for _, i in inputs]),
                jnp.asarray(b, jnp.int32), jnp.float32(global_threshold),
                jnp.asarray(recompute_boundaries), jnp.asarray(recompute_threshold))
        return tuple(np.asarray(x) for x in out)

    return run


def limits_that_bind(inputs, bounds, threshold, region_counts):
    """How many owners' regions the cap cuts (above the threshold > hi), the floor
    fills (fewer than lo above it, more nonzero entries), and cut through equal
    magnitudes (the last kept and the first dropped entry tie)."""
    total = sparse_allreduce_reference(inputs, N)
    lo, hi = region_counts
    capped = floored = tied = 0
    for a, b in zip(bounds[:-1], bounds[1:]):
        mags = np.abs(total[a:b][total[a:b] != 0])
        above = int(np.count_nonzero(mags >= threshold))
        want = min(max(above, min(lo, mags.size)), hi)
        ordered = np.sort(mags)[::-1]
        capped += above > hi
        floored += want > above
        tied += 0 < want < mags.size and ordered[want - 1] == ordered[want]
    return capped, floored, tied


@pytest.mark.parametrize("p", [3, 8])
def test_oktopk_matches_reference_and_mpi_bit_for_bit(p):
    mpi = mpi_results(p)
    assert mpi is not None, "MPI results missing ($JSS_AXIS_MPI_DIR)"
    balanced_seen = set()
    for case, (pattern, kw) in oktopk_cases(p).items():
        kw = dict(kw)
        k = kw.pop("k")
        counts = kw.pop("region_counts", None)
        partition = kw.pop("partition", "regions")
        hashed = partition == "hash"
        inputs = [make_pattern(pattern, r, p) for r in range(p)]
        out, contributed, bounds, threshold, stats = oktopk_fn(p, k, counts, None, partition)(
            inputs, **kw)
        given = None if kw.get("recompute_threshold", True) else kw["global_threshold"]
        owners = hash_owner_reference(np.arange(N), p) if hashed else None
        ref, ref_thr, masks = oktopk_reference(inputs, N, k, given, boundaries=bounds[0],
                                               region_counts=counts, owners=owners)
        np.testing.assert_allclose(out[0], ref, rtol=1e-5, atol=1e-6, err_msg=case)
        for r in range(p):
            np.testing.assert_array_equal(contributed[r], masks[r], err_msg=case)
        assert identical_rows(out) and identical_rows(bounds) and identical_rows(threshold), case
        if given is None:
            assert threshold[0] == pytest.approx(ref_thr, rel=1e-6), case
        if counts is not None and given is not None:
            # the limits bind: not what the threshold alone keeps
            assert not np.array_equal(ref, oktopk_reference(inputs, N, k, given)[0]), case
        if counts is not None and given is not None and not hashed:
            # and the limit the case is named for binds (the cases share one (lo, hi))
            capped, floored, tied = limits_that_bind(inputs, bounds[0], given, counts)
            assert {"limits/capped": capped, "limits/floor": floored,
                    "limits/ties": tied}[case], (case, capped, floored, tied)
        # the MPI transport: the same bits
        key = f"oktopk/{case}"
        assert out[0].tobytes() == mpi[f"{key}/out"].tobytes(), case
        np.testing.assert_array_equal(contributed, mpi[f"{key}/contributed"], err_msg=case)
        assert bounds[0].tolist() == mpi[f"{key}/boundaries"].tolist(), case
        assert threshold[0].tobytes() == mpi[f"{key}/threshold"].tobytes(), case
        np.testing.assert_array_equal(stats[:, 3:], mpi[f"{key}/stats"][:, 3:], err_msg=case)
        # bytes: what the static shapes carry
        sent, msgs, balanced = oktopk_expect(
            inputs, p, k, bounds[0].tolist(), out[0], kw.get("recompute_boundaries", True),
            kw.get("recompute_threshold", True), hashed=hashed)
        assert (stats[:, 0] == sent).all() and (stats[:, 1] == sent).all(), (case, stats, sent)
        assert (stats[:, 2] == msgs).all() and (stats[:, 4] == balanced).all(), case
        assert (stats[:, 5] == ALGORITHM_IDS["oktopk"]).all()
        if balanced:
            balanced_seen.add(case)
        if case == "reuse/skewed":  # the capacities' top rungs; nothing dropped
            union = np.unique(np.concatenate([i[i >= 0] for _, i in inputs]))
            assert np.count_nonzero(out[0]) == len(union) > 2 * CAP
            assert sent >= HB * (p - 1) + 8 * CAP * (p - 1)  # slices of `cap` entries
    # everything in owner 0's region: balanced at P > 4 (never at P <= 4: largest <= total)
    assert ("reuse/skewed" in balanced_seen) if p > 4 else not balanced_seen


# At 8 devices only: the 16-bit wire changes what a message holds, not who sends it to
# whom, and the float32 cases above check that rank arithmetic at 3 and 8; 8 also runs
# the balancing step. P = 3 took 4 more Ok-Topk programs (~5 CPU-s of XLA each).
@pytest.mark.parametrize("p", [8])
def test_oktopk_on_a_16bit_wire_matches_mpi_bit_for_bit(p):
    mpi = mpi_results(p)
    assert mpi is not None, "MPI results missing ($JSS_AXIS_MPI_DIR)"
    for case in OKTOPK_WIRE_CASES:
        pattern, kw = oktopk_cases(p)[case]
        kw = dict(kw)
        k = kw.pop("k")
        counts = kw.pop("region_counts", None)
        inputs = [make_pattern(pattern, r, p) for r in range(p)]
        out, contributed, bounds, threshold, stats = oktopk_fn(p, k, counts, jnp.bfloat16)(
            inputs, **kw)
        key = f"oktopk_bf16/{case}"
        assert out[0].tobytes() == mpi[f"{key}/out"].tobytes(), case
        np.testing.assert_array_equal(contributed, mpi[f"{key}/contributed"], err_msg=case)
        assert threshold[0].tobytes() == mpi[f"{key}/threshold"].tobytes(), case
        np.testing.assert_array_equal(stats[:, 3:], mpi[f"{key}/stats"][:, 3:], err_msg=case)
        assert identical_rows(out), case
        # the owners select on float32 sums of the rounded inputs, then round the sums once
        rounded = [(np.asarray(jnp.asarray(v).astype(jnp.bfloat16).astype(jnp.float32)), i)
                   for v, i in inputs]
        given = None if kw.get("recompute_threshold", True) else kw["global_threshold"]
        ref, _, masks = oktopk_reference(rounded, N, k, given, boundaries=bounds[0],
                                         region_counts=counts)
        np.testing.assert_array_equal(out[0] != 0, ref != 0, err_msg=case)
        np.testing.assert_allclose(out[0], ref, rtol=2.0**-8 + 1e-6, atol=0, err_msg=case)
        for r in range(p):
            np.testing.assert_array_equal(contributed[r], masks[r], err_msg=case)
        # bytes: the static shapes' messages with 6-byte entries
        sent, msgs, balanced = oktopk_expect(
            inputs, p, k, bounds[0].tolist(), out[0], kw.get("recompute_boundaries", True),
            kw.get("recompute_threshold", True), wire=1)
        assert (stats[:, 0] == sent).all() and (stats[:, 1] == sent).all(), (case, stats, sent)
        assert (stats[:, 2] == msgs).all() and (stats[:, 4] == balanced).all(), case
        if case == "reuse/skewed":
            assert balanced == int(p > 4)


def test_oktopk_errors_raise_on_every_device():
    p = 3
    inputs = [make_pattern("random", r, p) for r in range(p)]
    with pytest.raises(Exception, match="`boundaries` must start at 0, end at `size` and never "
                                        "decrease"):
        oktopk_fn(p, 30)(inputs, boundaries=[0, 3000, 10, N], recompute_boundaries=False)
    bad = [(v.copy(), i.copy()) for v, i in inputs]
    bad[1][0][0] = np.nan
    with pytest.raises(Exception, match=r"non-finite \(NaN or Inf\) entries in `values` on "
                                        r"rank\(s\) 1"):
        oktopk_fn(p, 30)(bad)
    out = oktopk_fn(p, 30)(inputs)[0]  # and the next call works
    np.testing.assert_allclose(out[0], oktopk_reference(inputs, N, 30)[0], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match=r"`boundaries` must have shape \(4,\)"):
        jax.shard_map(lambda v: jss.oktopk_allreduce(
            v, jnp.arange(2, dtype=jnp.int32), size=N, k=1, boundaries=jnp.zeros(3, jnp.int32),
            comm=jss.axis("data")).sum, mesh=mesh_of(p), in_specs=P(), out_specs=P(),
            check_vma=False)(jnp.ones(2))


# ---- block_allreduce ------------------------------------------------------------------------
@functools.cache
def block_fn(p, b):
    def body(x):
        out, stats = jss.block_allreduce(x[0], block_size=b, comm=jss.axis("data"),
                                         return_stats="vector")
        return out[None], stats[None]

    f = jax.jit(jax.shard_map(body, mesh=mesh_of(p), in_specs=P("data"), out_specs=P("data"),
                              check_vma=False))
    return lambda xs: tuple(np.asarray(a) for a in f(rows_of(p, xs)))


@pytest.mark.parametrize("p", [3, 8])
def test_block_is_the_rank_order_sum_and_equals_mpi(p):
    mpi = mpi_results(p)
    assert mpi is not None, "MPI results missing ($JSS_AXIS_MPI_DIR)"
    switched = {}
    for case, (pattern, b) in BLOCK_CASES.items():
        xs = [block_input(pattern, r, p) for r in range(p)]
        out, stats = block_fn(p, b)(xs)
        assert out[0].tobytes() == rank_order_sum(xs).tobytes(), case  # lossless, bit for bit
        assert out[0].tobytes() == mpi[f"block/{case}/out"].tobytes(), case
        assert identical_rows(out), case
        assert (stats[:, 3] == mpi[f"block/{case}/stats"][:, 3]).all(), case  # nonzero blocks
        sent, msgs, dense = block_expect(xs, p, b)
        assert (stats[:, 0] == sent).all() and (stats[:, 1] == sent).all(), (case, stats, sent)
        assert (stats[:, 2] == msgs).all() and (stats[:, 5] == ALGORITHM_IDS["block"]).all()
        switched[case] = int(stats[0, 4])
        assert switched[case] == dense
    # dense input: whole ranges travel (the ladder's top); sparse inputs stay sparse
    assert switched["dense/k_equals_n"] == 1 and switched["sparse/same"] == 0
    assert switched["empty/all_zero"] == 0


def test_block_nan_policy_raises_on_every_device():
    p = 3
    xs = np.stack([block_input("random", r, p) for r in range(p)])
    xs[2, 5] = np.inf
    assert np.isinf(block_fn(p, 16)(xs)[0][:, 5]).all()  # "propagate" (the default) sums it
    f = jax.jit(jax.shard_map(
        lambda x: jss.block_allreduce(x[0], block_size=16, comm=jss.axis("data"),
                                      nan_policy="raise")[None],
        mesh=mesh_of(p), in_specs=P("data"), out_specs=P("data"), check_vma=False))
    with pytest.raises(Exception, match=r"non-finite \(NaN or Inf\) entries in `values` on "
                                        r"rank\(s\) 2"):
        np.asarray(f(rows_of(p, xs)))


# ---- oktopk_sync / block_sync in shard_map-ped train steps -----------------------------------
@functools.cache
def trainer(p, name, check_vma=False, **sync_kw):
    sync = SYNC_RUNS[name](jss, comm=jss.axis("data"), **sync_kw) if name in SYNC_RUNS else \
        jss.oktopk_sync(k=SYNC_K, comm=jss.axis("data"), **sync_kw)
    return replicated_trainer(mesh_of(p), optax.chain(sync, optax.sgd(SYNC_LR)), sync_grad,
                              sync_targets(p), SYNC_DIM, check_vma)


def test_oktopk_sync_exact_is_numpy_oktopk_sgd_with_sharded_residuals():
    p = 3
    w, state = trainer(p, "exact", True, selection="exact", tau=1, tau_prime=4)(SYNC_STEPS)
    copies = device_copies(w)
    assert len(copies) == p and all(c.tobytes() == copies[0].tobytes() for c in copies)
    t = sync_targets(p)
    fns = [lambda w_, s, r=r: (w_ - t[r]) * np.float32(1 + s % 3) for r in range(p)]
    ref_w, ref_res = oktopk_sgd_reference(np.zeros(SYNC_DIM, np.float32), fns, SYNC_K, SYNC_LR,
                                          SYNC_STEPS)
    np.testing.assert_allclose(copies[0], ref_w, rtol=2e-5, atol=2e-6)
    residual = state[0].residual
    assert residual.shape == (p, SYNC_DIM)
    assert residual.sharding.spec[0] == "data"  # one residual per device, not replicated
    np.testing.assert_allclose(np.asarray(residual), np.stack(ref_res), rtol=2e-5, atol=2e-6)
    assert identical_rows(state[0].boundaries) and identical_rows(state[0].global_threshold)
    assert (np.asarray(state[0].last_stats)[:, 5] == ALGORITHM_IDS["oktopk"]).all()


def test_oktopk_sync_warmup_in_shard_map_matches_numpy():
    # dense for 2 steps, then SYNC_K: the phases' lax.switch around JAX collectives, typed
    # under check_vma (per-phase k: tests/mpi/test_oktopk_sync_mpi.py)
    p, steps = 4, 5
    w, state = trainer(p, "warmup", True, selection="exact", tau=1, tau_prime=4,
                       warmup=((2, 1.0),))(steps)
    copies = device_copies(w)
    assert all(c.tobytes() == copies[0].tobytes() for c in copies)
    t = sync_targets(p)
    fns = [lambda w_, s, r=r: (w_ - t[r]) * np.float32(1 + s % 3) for r in range(p)]
    k_at = lambda s: SYNC_DIM if s < 2 else SYNC_K  # noqa: E731
    ref_w, ref_res = oktopk_sgd_reference(np.zeros(SYNC_DIM, np.float32), fns, k_at, SYNC_LR,
                                          steps)
    np.testing.assert_allclose(copies[0], ref_w, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(np.asarray(state[0].residual), np.stack(ref_res), rtol=2e-5,
                               atol=2e-6)
    assert identical_rows(state[0].boundaries) and identical_rows(state[0].global_threshold)


@pytest.mark.parametrize("p", [8])  # P = 3: the exact-policy test above
def test_sync_runs_equal_the_mpi_runs_bit_for_bit(p):
    mpi = mpi_results(p)
    assert mpi is not None, "MPI results missing ($JSS_AXIS_MPI_DIR)"
    for name in SYNC_RUNS:
        w, state = trainer(p, name)(SYNC_STEPS)
        copies = device_copies(w)
        assert all(c.tobytes() == copies[0].tobytes() for c in copies), name
        assert copies[0].tobytes() == mpi[f"sync/{name}/params"].tobytes(), name
        if name == "block":  # lossless: mean-gradient SGD with the rank-order sum
            ref, t = np.zeros(SYNC_DIM, np.float32), sync_targets(p)
            for s in range(SYNC_STEPS):
                g = rank_order_sum([(ref - t[r]) * np.float32(1 + s % 3) for r in range(p)])
                ref = (ref - np.float32(SYNC_LR) * (g / p)).astype(np.float32)
            np.testing.assert_allclose(copies[0], ref, rtol=1e-5, atol=1e-6)
        else:
            assert np.asarray(state[0].residual).tobytes() == \
                mpi[f"sync/{name}/residual"].tobytes()


def test_oktopk_sync_pmap_equals_shard_map_and_restore_continues_exactly():
    p = 8
    train = trainer(p, "oktopk_reuse")
    w_sm, state_sm = train(5)
    tx = optax.chain(SYNC_RUNS["oktopk_reuse"](jss, comm=jss.axis("data")), optax.sgd(SYNC_LR))

    @functools.partial(jax.pmap, axis_name="data", in_axes=(0, 0, 0, None))
    def step(w, state, t, i):
        updates, state = tx.update({"w": sync_grad(w, t, i)}, state, {"w": w})
        return w + updates["w"], state

    w = jnp.zeros((p, SYNC_DIM), jnp.float32)
    state = jax.pmap(lambda x: tx.init({"w": x}), axis_name="data")(w)
    for s in range(5):
        w, state = step(w, state, sync_targets(p), jnp.int32(s))
    assert identical_rows(w) and np.asarray(w)[0].tobytes() == device_copies(w_sm)[0].tobytes()
    assert np.asarray(state[0].residual).tobytes() == \
        np.asarray(state_sm[0].residual).tobytes()
    # checkpoint after 3 steps, restore, continue: the same bits as running straight through
    w3, s3 = train(3)
    saved_w = np.asarray(device_copies(w3)[0])
    saved = jax.tree_util.tree_map(np.asarray, s3)  # what a checkpoint holds
    restored = jax.tree_util.tree_map(lambda x: rows_of(p, x), saved)
    w_b, state_b = train(2, saved_w, restored, start=3)
    assert device_copies(w_b)[0].tobytes() == device_copies(w_sm)[0].tobytes()
    assert np.asarray(state_b[0].residual).tobytes() == \
        np.asarray(state_sm[0].residual).tobytes()
