"""shared_support_sync against topk_sync and dense_sync at the same density: the quick
start's MLP on digits (mpiexec -n 2 python -m mpi4py examples/shared_support_digits.py).

Every sync trains the same model from the same start on the same shards for the same
steps (SGD with momentum); printed per sync: the loss and accuracy on the whole data set
after the last step, and the bytes this rank sent over the run (from the statistics).
``--random-fraction F ...`` adds, for each refresh period, a run per fraction of the
support drawn at random between refreshes (``random_fraction=F``, ``--seed``).
"""
import argparse

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from mpi4py import MPI
from sklearn.datasets import load_digits

import jax_sparse_sync as jss

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--density", type=float, default=0.01)
parser.add_argument("--steps", type=int, default=300)
parser.add_argument("--refresh", type=int, nargs="+", default=[4, 16])
parser.add_argument("--random-fraction", type=float, nargs="*", default=[],
                    help="also run shared_support_sync(random_fraction=F) for each F")
parser.add_argument("--seed", type=int, default=0, help="the random draws' seed")
parser.add_argument("--no-dense", action="store_true", help="skip the dense_sync run")
args = parser.parse_args()

rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
data = load_digits()
x_all = jnp.asarray(data.data / 16.0, jnp.float32)
y_all = jnp.asarray(data.target)
x, y = x_all[rank::size], y_all[rank::size]  # this rank's shard
model = nn.Sequential([nn.Dense(256), nn.relu, nn.Dense(10)])
params0 = model.init(jax.random.key(0), x[:1])


def loss_of(params, x, y):
    return optax.softmax_cross_entropy_with_integer_labels(model.apply(params, x), y).mean()


syncs = {} if args.no_dense else {"dense_sync": jss.dense_sync()}
syncs[f"topk_sync(density={args.density})"] = jss.topk_sync(density=args.density)
for r in args.refresh:
    syncs[f"shared_support_sync(density={args.density}, refresh_every={r})"] = \
        jss.shared_support_sync(density=args.density, refresh_every=r)
    for f in args.random_fraction:
        syncs[f"shared_support_sync(density={args.density}, refresh_every={r}, "
              f"random_fraction={f})"] = jss.shared_support_sync(
                  density=args.density, refresh_every=r, random_fraction=f, seed=args.seed)

for name, sync in syncs.items():
    tx = optax.chain(sync, optax.sgd(0.1, momentum=0.9))

    @jax.jit
    def step(params, opt_state, x, y):
        grads = jax.grad(loss_of)(params, x, y)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    params, opt_state, sent = params0, tx.init(params0), 0
    for i in range(args.steps):
        lo = (32 * i) % (len(y) - 32)
        params, opt_state = step(params, opt_state, x[lo:lo + 32], y[lo:lo + 32])
        sent += int(jss.SyncStats.from_vector(jss.last_stats(opt_state)).bytes_sent)
    loss = float(loss_of(params, x_all, y_all))
    accuracy = float((model.apply(params, x_all).argmax(-1) == y_all).mean())
    checksums = MPI.COMM_WORLD.allgather(
        sum(float(p.sum()) for p in jax.tree.leaves(params)).hex())
    assert len(set(checksums)) == 1, f"{name}: replicas differ"
    if rank == 0:
        print(f"{name:75s} loss {loss:.4f} accuracy {accuracy:.4f} bytes sent by rank 0 {sent}",
              flush=True)
