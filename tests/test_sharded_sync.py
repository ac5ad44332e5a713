"""``jss.sharded_sync`` in one process: argument errors, the elementwise check, the
regions' exchanges at one rank, the wire model, the regions re-cut by
``jss.reshard_state`` (2 -> 4 -> 3) and the state per rank; and the jobs that
run it across ranks and devices: the Orbax restore at P = 2 -> 4 -> 3 under
``mpiexec -n 4`` (tests/mpi/sharded_restore_case.py) and the mesh-axis cases on 4
host devices (tests/axis/axis_sharded_cases.py). The MPI transform tests are
tests/mpi/test_sharded_sync_mpi.py (run here at one rank, under mpiexec at 3)."""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from test_axis_transport import env_with_devices
from test_multirank import ROOT, run_under_mpiexec

import jax_sparse_sync as jss
from jax_sparse_sync.model import sharded as model
from jax_sparse_sync.ops.region_gather import region_gather
from jax_sparse_sync.ops.region_reduce import region_reduce
from jax_sparse_sync.transforms.sharded_reshard import recut

ADAMW = optax.adamw(1e-3)


@pytest.mark.parametrize("kwargs,match", [
    (dict(density=0.0), "`density` must be in \\(0, 1\\]"),
    (dict(density=1.5), "`density` must be in \\(0, 1\\]"),
    (dict(density=0.1, k=3), "exactly one of `density` or `k`"),
    (dict(), "pass `density=`"),
    (dict(density=0.1, change="sparse"), "`change` must be one of"),
    (dict(density=0.1, change_density=2.0), "`change_density` must be in"),
    (dict(density=0.1, change="lazy", change_density=0.1), "leave it None"),
    (dict(density=0.1, max_grad_norm=0.0), "`max_grad_norm` must be None or a positive"),
    (dict(density=0.1, max_grad_norm=True), "`max_grad_norm` must be None or a positive"),
])
def test_bad_arguments_name_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        jss.sharded_sync(ADAMW, **kwargs)


@pytest.mark.parametrize("inner,match", [
    (optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-3)), "not elementwise"),
    (optax.lamb(1e-3), "not elementwise"),
    (optax.adafactor(1e-3), "state leaf .* has shape"),
])
def test_an_optimizer_that_is_not_elementwise_is_refused(inner, match):
    with pytest.raises(ValueError, match=f"sharded_sync: `inner`.*{match}|{match}"):
        jss.sharded_sync(inner, density=0.1)


def test_an_inner_that_is_no_optimizer_is_refused():
    with pytest.raises(TypeError, match="`inner` must be an optax.GradientTransformation"):
        jss.sharded_sync("adam", density=0.1)


@pytest.mark.parametrize("inner", [
    optax.adam(1e-3), optax.adamw(optax.cosine_decay_schedule(1e-3, 100)),
    optax.sgd(0.1, momentum=0.9, nesterov=True), optax.rmsprop(1e-3), optax.lion(1e-4)])
def test_elementwise_optimizers_are_accepted(inner):
    jss.sharded_sync(inner, density=0.1)


def test_the_regions_exchanges_at_one_rank_and_region_reduce_is_not_an_allreduce():
    region, stats = region_reduce(jnp.array([2., -1., 0.5]), jnp.array([3, 0, 3], jnp.int32),
                                  size=5)
    assert region.tolist() == [-1.0, 0.0, 0.0, 2.5, 0.0]  # duplicates summed
    assert jss.SyncStats.from_vector(stats).algorithm_name == "region_reduce"
    out, _ = region_gather(jnp.array([2., -1.]), jnp.array([3, -1], jnp.int32), size=5)
    assert out.tolist() == [0.0, 0.0, 0.0, 2.0, 0.0]
    with pytest.raises(ValueError, match="use jss.sharded_sync"):
        jss.sparse_allreduce(jnp.ones(2), jnp.arange(2, dtype=jnp.int32), size=4,
                             algorithm="region_reduce")


def test_the_wire_model():
    p, n, k = 4, 1003, 10
    for change in model.CHANGES:
        v = model.sharded_sync_volume(nranks=p, size=n, k=k, change=change, change_k=3, rank=1)
        assert v.bytes_min <= v.bytes_typical <= v.bytes_max
    # the reduce: 56 + 8 + 8 bytes to each peer, then 8 bytes an entry to other owners
    assert model.region_reduce_bytes(nranks=4, rank=1, sent_entries=[2, 5, 0, 1]) == \
        3 * (56 + 16) + 8 * 3
    assert model.region_reduce_bytes(nranks=1, rank=0, sent_entries=[7]) == 0
    # the dense change: every region padded to ceil(N / P), to each of P-1 peers
    assert model.change_bytes("dense", nranks=4, size=n, rank=0, entries=0) == \
        3 * (56 + 8) + 3 * 4 * 251
    # a sparse block past half its region travels dense (4 bytes a position)
    assert model.change_bytes("lazy", nranks=4, size=n, rank=3, entries=200) == \
        3 * (56 + 8 + 8) + 3 * 4 * 251
    assert model.choose_change(nranks=4, size=10**6, k=10**4, change_k=2500) == "topk"
    assert model.choose_change(nranks=4, size=1000, k=900, change_k=250) == "dense"


def _states(size, n=23, seed=0):
    """``size`` ranks' hand-made states of sharded_sync(adam) for ``n`` parameters."""
    tx = jss.sharded_sync(optax.adam(1e-3), k=2, change="topk")
    slot = -(-n // size)
    rng = np.random.default_rng(seed)
    base = jax.tree_util.tree_map(np.asarray, tx.init({"w": jnp.zeros(n)}))
    states = []
    for r in range(size):
        lo, hi = n * r // size, n * (r + 1) // size

        def region(scale):
            out = np.zeros(slot, np.float32)
            out[:hi - lo] = np.arange(lo, hi, dtype=np.float32) * scale + 1
            return out
        adam = base.inner[0]._replace(count=np.int32(5), mu=region(1.0), nu=region(0.5))
        states.append(base._replace(
            count=np.int32(5), residual=rng.standard_normal(n).astype(np.float32),
            inner=(adam,) + tuple(base.inner[1:]), change_residual=region(-2.0),
            world=np.eye(size, dtype=np.int32)[r]))
    return states


@pytest.mark.parametrize("old_size,new_size", [(2, 4), (4, 3), (3, 1), (4, 4)])
def test_reshard_recuts_the_regions_and_keeps_the_residual_mean(old_size, new_size):
    n = 23
    old = _states(old_size, n)
    new = jss.reshard_state(old, new_size)
    slot = -(-n // new_size)
    everything = np.arange(n, dtype=np.float32)
    for j, s in enumerate(new):
        lo, hi = n * j // new_size, n * (j + 1) // new_size
        assert s.inner[0].mu.shape == s.change_residual.shape == (slot,)
        np.testing.assert_array_equal(s.inner[0].mu[:hi - lo], everything[lo:hi] + 1)
        np.testing.assert_array_equal(s.change_residual[:hi - lo], everything[lo:hi] * -2 + 1)
        assert not s.inner[0].mu[hi - lo:].any()  # the padding stays zero
        assert int(s.inner[0].count) == 5 and int(s.count) == 5
        assert s.world.tolist() == np.eye(new_size, dtype=int)[j].tolist()
    mean_old = np.mean([s.residual.astype(np.float64) for s in old], 0)
    mean_new = np.mean([s.residual.astype(np.float64) for s in new], 0)
    np.testing.assert_allclose(mean_new, mean_old, rtol=1e-6, atol=1e-7)
    assert recut([s.change_residual for s in old], n, 1, 0).sum() == \
        recut([s.change_residual for s in new], n, 1, 0).sum()


def test_reshard_refuses_states_that_disagree_or_are_out_of_order():
    old = _states(2)
    bad = [old[0], old[1]._replace(inner=(old[1].inner[0]._replace(count=np.int32(6)),)
                                   + tuple(old[1].inner[1:]))]
    with pytest.raises(ValueError, match="count.*differs between old rank 0 and old rank 1"):
        jss.reshard_state(bad, 3)
    with pytest.raises(ValueError, match="was not written by rank 0"):
        jss.reshard_state(old[::-1], 3)


def test_checkpoint_template_sizes_the_regions_for_the_writers():
    state = jss.sharded_sync(ADAMW, k=2, change="topk").init({"w": jnp.zeros(23)})
    template = jss.checkpoint_template(state, 4, rank=2)
    assert template.inner[0].mu.shape == template.change_residual.shape == (6,)
    assert template.world.tolist() == [0, 0, 1, 0] and template.residual.shape == (23,)


def test_the_optimizer_state_per_rank_is_a_quarter_at_four_ranks():
    n = 10_001
    one = jss.sharded_sync(ADAMW, density=0.01, change="topk").init({"w": jnp.zeros(n)})
    shard = jss.reshard_state([jax.tree_util.tree_map(np.asarray, one)], 4, rank=3)
    replicated = sum(x.nbytes for x in jax.tree_util.tree_leaves(ADAMW.init(jnp.zeros(n))))
    sharded = sum(np.asarray(x).nbytes for x in jax.tree_util.tree_leaves(shard.inner))
    assert sharded <= (0.25 + 0.01) * replicated, (sharded, replicated)


def test_restore_with_orbax_at_two_four_and_three_ranks(tmp_path):
    pytest.importorskip("orbax.checkpoint", reason="Orbax is not installed")
    proc = run_under_mpiexec(4, ["-m", "mpi4py", "tests/mpi/sharded_restore_case.py",
                                 str(tmp_path)], timeout=600)
    tail = (proc.stdout + proc.stderr)[-6000:]
    assert proc.returncode == 0, tail
    assert "SHARDED RESTORE OK" in proc.stdout, tail


def test_mesh_axis_cases_on_four_host_devices():
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--timeout=300",
           "--timeout-method=thread", os.path.join("tests", "axis", "axis_sharded_cases.py")]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900,
                              env=env_with_devices(4))
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"sharded axis cases timed out (deadlock?)\n{str(e.stdout)[-4000:]}")
    tail = (proc.stdout + proc.stderr)[-8000:]
    assert proc.returncode == 0, tail
    assert "2 passed" in proc.stdout, tail


def test_the_examples_sync_sharded_and_the_options_it_refuses():
    # loaded by path, as tests/test_convergence_examples.py loads the examples
    import importlib.util

    sys.path.insert(0, os.path.join(ROOT, "examples"))
    try:
        spec = importlib.util.spec_from_file_location(
            "_example_train_lm", os.path.join(ROOT, "examples", "train_lm.py"))
        train_lm = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(train_lm)
    finally:
        sys.path.remove(os.path.join(ROOT, "examples"))
    models = train_lm.models

    bad = train_lm.parse_args(["--sync", "sharded", "--wire-dtype", "bfloat16"])
    with pytest.raises(SystemExit, match="--wire-dtype: not options of --sync sharded"):
        models.make_sync(bad)
    args = train_lm.parse_args(["--sync", "sharded", "--change", "lazy", "--steps", "10"])
    assert models.make_sync(args) is None  # the optimizer is the sync: make_optimizer's
    state = train_lm.make_optimizer(args, None).init({"w": jnp.zeros(10)})
    assert isinstance(state, jss.ShardedSyncState) and state.change_residual.shape == (0,)
    assert models.sync_label(args) == "sharded 1% change=lazy"
