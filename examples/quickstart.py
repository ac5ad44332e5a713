"""Quick start: a Flax MLP on digits, 1 % sparse sync (mpiexec -n 2 python -m mpi4py this.py)."""
import flax.linen as nn, jax, jax.numpy as jnp, optax
from mpi4py import MPI
from sklearn.datasets import load_digits
import jax_sparse_sync as jss                     # its import tunes malloc: no per-step page faults

rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
data = load_digits()
x = jnp.asarray(data.data[rank::size] / 16.0, jnp.float32)   # this rank's shard
y = jnp.asarray(data.target[rank::size])
model = nn.Sequential([nn.Dense(256), nn.relu, nn.Dense(10)])
params = model.init(jax.random.key(0), x[:1])                # same seed: same start on every rank
tx = optax.chain(jss.topk_sync(density=0.01), optax.sgd(0.1, momentum=0.9))
opt_state = tx.init(params)

def step(params, opt_state, x, y):
    loss_fn = lambda p: optax.softmax_cross_entropy_with_integer_labels(model.apply(p, x), y).mean()
    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = tx.update(grads, opt_state, params)  # the sparse allreduce runs here
    return optax.apply_updates(params, updates), opt_state, loss

step = jax.jit(step, donate_argnums=(0, 1))   # params and state (the residual) updated in place
for i in range(300):
    lo = (32 * i) % (len(y) - 32)
    params, opt_state, loss = step(params, opt_state, x[lo:lo + 32], y[lo:lo + 32])
    if i % 100 == 0 or i == 299:
        sent = int(jss.SyncStats.from_vector(jss.last_stats(opt_state)).bytes_sent)
        print(f"rank {rank} step {i} loss {float(loss):.4f} bytes sent {sent}", flush=True)
print(f"rank {rank} params checksum {sum(float(p.sum()) for p in jax.tree.leaves(params)).hex()}")
