"""Byte counters cannot overflow: sums of the per-step counters saturate instead of wrapping.

Without x64 the counters are int32 (the C++ side counts in int64 and saturates
when it writes them); a step that adds two exchanges' traffic, a grouped step
that adds its groups', and ``jss.last_stats`` over several syncs add such
counters, and an int32 sum would wrap to a negative byte count.
"""

import jax.numpy as jnp
import numpy as np
import optax

import jax_sparse_sync as jss
from jax_sparse_sync.stats import STATS_FIELDS, add_traffic, saturating_add, saturating_sum

TOP = np.iinfo(np.int32).max


def test_saturating_add_and_sum_stop_at_the_largest_int32():
    a = jnp.array([TOP - 10, 5, TOP, 0, 7], jnp.int32)
    b = jnp.array([100, 6, 1, TOP, -1], jnp.int32)
    assert saturating_add(a, b).tolist() == [TOP, 11, TOP, TOP, 6]
    x = jnp.array([[TOP // 2, 1], [TOP // 2, 2], [TOP // 2, 3]], jnp.int32)
    assert saturating_sum(x, axis=0).tolist() == [TOP, 6]
    assert int(jnp.sum(x, axis=0)[0]) < 0  # what the plain sum did


def test_add_traffic_and_last_stats_saturate():
    big = jnp.array([TOP - 5, TOP - 5, 3, 10, 0, 2], jnp.int32)
    other = jnp.array([100, 200, 4, 99, 1, 7], jnp.int32)
    out = add_traffic(big, other)
    assert out.tolist() == [TOP, TOP, 7, 10, 0, 2]  # nnz and algorithm stay big's
    tx = optax.chain(jss.topk_sync(k=1), jss.dense_sync())
    top, dense = tx.init({"w": jnp.zeros(3)})
    state = (top._replace(last_stats=big), dense._replace(last_stats=other))
    total = jss.SyncStats.from_vector(jss.last_stats(state))
    assert int(total.bytes_sent) == TOP and int(total.bytes_received) == TOP
    assert len(STATS_FIELDS) == big.shape[0]
