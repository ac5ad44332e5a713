"""The N-sized buffers a compiled ``adam_direction_sync(topk_sync)`` step writes.

``benchmarks/step_local_work.py`` counts them on the LM of the time-to-accuracy
benchmark (docs/topics/time_to_accuracy.md, "Where the sparse step's local work
goes"); this pins the same structure on a small tree: besides the parameters' own
update, the only N-entry arrays written are the fused Adam pass's outputs (mu, nu,
age and the accumulator, in place), the sparse allreduce's dense sum and the
residual update (in place): no copy, concatenate or dynamic-update-slice of N
entries, no N-entry fusion (no concatenated gradient, no direction in leaves).
"""

import collections
import os
import sys

import jax
import jax.numpy as jnp
import optax

import jax_sparse_sync as jss
from compiled_step import donated_step

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
import step_local_work  # noqa: E402


def test_written_buffers_parser_sees_copies():
    # a plain (not donated) step copies the state: the parser must see it
    text = jax.jit(lambda x: x.at[3].set(1.0)).lower(jnp.zeros(40000)).compile().as_text()
    ops = [op for *_, op, _, _ in step_local_work.written_buffers(text, min_entries=40000)]
    assert ops and set(ops) <= {"copy", "fusion", "dynamic-update-slice", "scatter"}


def test_adam_direction_topk_step_writes_no_extra_n_entry_buffer():
    params = {"a": jnp.zeros((300, 200)), "b": jnp.zeros((2000,)), "c": jnp.zeros((7,))}
    n = 300 * 200 + 2000 + 7
    tx = optax.chain(optax.clip_by_global_norm(1.0),
                     jss.adam_direction_sync(jss.topk_sync(density=0.01),
                                             momentum_masking="restart"),
                     optax.add_decayed_weights(0.1), optax.scale_by_learning_rate(1e-3))
    step, args = donated_step(tx, params, grad_fill=0.5)
    text = step.lower(*args).compile().as_text()
    written = step_local_work.written_buffers(text, min_entries=n)
    by_op = collections.Counter(op for _, _, op, _, _ in written)
    # mu, nu, age, acc (one fused call), the dense sum, the residual update
    assert by_op == {"custom-call": 6}, written
    step(*args)  # and it runs
