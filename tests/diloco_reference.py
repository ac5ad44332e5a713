"""DiLoCo in NumPy, on flat float32 parameters: the reference of jss.diloco's tests.

Shared by tests/test_diloco.py (one process, and P workers simulated with vmap),
tests/mpi/test_diloco_mpi.py and tests/axis/diloco_cases.py. The workers' parameters
are flat vectors; a fragment is a list of flat index ranges (its leaves).
"""

from __future__ import annotations

import numpy as np

from reference import topk_reference


def fragment_schedule(every: int, fragments: int):
    """``t mod every`` -> the fragment whose outer step runs after step t (None: none):
    fragment f after the steps t = (f + 1) * every // fragments (mod every)."""
    table = {((f + 1) * every // fragments) % every: f for f in range(fragments)}
    return lambda t: table.get(t % every)


def mean_sync():
    """The dense mean over the workers (a sync without state)."""
    def run(pseudo, state):
        return np.mean(np.stack(pseudo), axis=0, dtype=np.float32).astype(np.float32), state
    return run, lambda size, nranks: None


def topk_sync_reference(k: int):
    """Error-feedback Top-k: each worker keeps the k largest of residual + pseudo-gradient,
    the kept entries are summed and divided by P, the rest stays in its residual."""
    def run(pseudo, residuals):
        out, new = np.zeros_like(pseudo[0]), []
        for acc in (res + pg for res, pg in zip(residuals, pseudo)):
            values, idx = topk_reference(acc, k)
            np.add.at(out, idx, values)
            kept = acc.copy()
            kept[idx] = 0.0
            new.append(kept)
        return (out / np.float32(len(pseudo))).astype(np.float32), new
    return run, lambda size, nranks: [np.zeros(size, np.float32) for _ in range(nranks)]


def diloco_reference(params0, grad_fns, *, steps: int, every: int, inner_lr: float,
                     groups, sync=None, outer_lr: float = 0.7, momentum: float = 0.9,
                     delay: int = 0, mix: float = 0.0):
    """DiLoCo on ``len(grad_fns)`` workers from the flat ``params0``.

    Inner optimizer: SGD (``p -= inner_lr * g``, ``g = grad_fns[r](p, step)``, step
    0-based). Outer optimizer: Nesterov SGD (``optax.sgd(outer_lr, momentum,
    nesterov=True)``; ``momentum=0`` plain SGD). ``groups``: each fragment's flat
    indices (an int array). ``sync``: ``(run, init)`` as :func:`mean_sync` (default).
    After step t the fragment whose turn it is (:func:`fragment_schedule`) takes its
    outer step; ``delay`` steps later every worker's fragment becomes ``mix * local
    + (1 - mix) * anchor``.

    Returns ``(params per worker, anchor, sync states, history)``; ``history[t]`` is
    ``(params per worker, anchor)`` after step t (1-based).
    """
    run, init = sync or mean_sync()
    nranks, turn = len(grad_fns), fragment_schedule(every, len(groups))
    params = [np.asarray(params0, np.float32).copy() for _ in range(nranks)]
    anchor = params[0].copy()
    traces = [np.zeros(len(ids), np.float32) for ids in groups]
    states = [init(len(ids), nranks) for ids in groups]
    history = {}
    for t in range(1, steps + 1):
        params = [p - np.float32(inner_lr) * fn(p, t - 1).astype(np.float32)
                  for p, fn in zip(params, grad_fns)]
        f = turn(t)
        if f is not None:
            ids = groups[f]
            synced, states[f] = run([anchor[ids] - p[ids] for p in params], states[f])
            traces[f] = synced + np.float32(momentum) * traces[f]
            step = synced + np.float32(momentum) * traces[f]
            anchor[ids] = anchor[ids] - np.float32(outer_lr) * step
        g = turn(t - delay) if t - delay >= 1 else None
        if g is not None:
            ids = groups[g]
            for p in params:
                p[ids] = np.float32(mix) * p[ids] + np.float32(1 - mix) * anchor[ids]
        history[t] = ([p.copy() for p in params], anchor.copy())
    return params, anchor, states, history


def leaf_groups(sizes, groups):
    """Each fragment's flat indices from per-leaf ``sizes`` and leaf-index ``groups``."""
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    return [np.concatenate([np.arange(offsets[i], offsets[i + 1]) for i in ids])
            for ids in groups]
