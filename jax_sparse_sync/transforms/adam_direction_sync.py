"""Adam in front of a sparse sync, with DGC's momentum factor masking.

``optax.chain(jss.topk_sync(...), optax.adam(...))`` makes Adam see the synced
sparse sum, where a coordinate sent every T steps arrives as one spike of ~T
gradients that Adam's second moment shrinks: sparse runs learn far slower than
dense (README, "Convergence"). Syncing each rank's own Adam direction instead
(``chain(scale_by_adam(), sync, ...)``) closes most of that gap, but leaves
one: a coordinate's accumulated directions go on the wire while its first
moment still holds the gradients just sent, so they keep pushing it for ~1/(1-b1)
more steps. DGC (Lin et al., ICLR 2018, Section 3.2) masks the momentum where a
coordinate was sent; :func:`adam_direction_sync` does that for Adam's first
moment, restarting that coordinate's bias correction so its next direction has
full size (as DGC's masked momentum ``u = g`` has).

Measured on the 10.9M-parameter byte-level LM (``examples/train_lm.py``, P = 4,
300 steps, 1 % with DGC's density ramp): validation loss 2.257 (+3.5 % of
dense's 2.181) with ``chain(scale_by_adam(), sync)``, see the README for the
masked figures.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jax_sparse_sync.transforms.flat import flat_size, ravel_leaves, split_like

__all__ = ["AdamDirectionSyncState", "adam_direction_sync", "MOMENTUM_MASKINGS"]

#: ``momentum_masking`` choices: restart the coordinate's first moment and its
#: bias correction; zero the first moment only; leave it (plain scale_by_adam).
MOMENTUM_MASKINGS = ("restart", "zero", "off")


class AdamDirectionSyncState(NamedTuple):
    """State of :func:`adam_direction_sync`: arrays only, it checkpoints with the optimizer.

    Attributes:
      count: steps taken (int32).
      mu: this rank's first moment of its own gradient, flat (N,) float32 in
        ``jax.tree_util`` order (the sync's residual layout).
      nu: this rank's second moment, flat (N,) float32.
      age: steps since each coordinate's first moment was last masked, flat
        (N,) float32 (its bias correction is ``1 - b1**age``).
      sync: the inner sync transform's state (residual, wire statistics).

    ``mu``, ``nu``, ``age`` and the sync's residual differ from rank to rank:
    checkpoint them per rank, like the residual.
    """

    count: jax.Array
    mu: jax.Array
    nu: jax.Array
    age: jax.Array
    sync: Any

    @property
    def last_stats(self):
        """The inner sync's ``last_stats`` (the step's wire statistics)."""
        return self.sync.last_stats


def adam_direction_sync(sync: optax.GradientTransformation, *, b1: float = 0.9,
                        b2: float = 0.999, eps: float = 1e-8,
                        momentum_masking: str = "restart") -> optax.GradientTransformation:
    """Each rank's Adam direction, synced by ``sync``, with momentum factor masking.

    Per rank: Adam's moments of the rank's own gradient, the bias-corrected
    direction ``mu_hat / (sqrt(nu_hat) + eps)`` handed to ``sync`` (which
    averages it over the ranks, sparsely and with error feedback), then, for
    every coordinate whose accumulated directions this rank sent this step
    after holding them back at least one step (its residual was nonzero
    before and is zero now), the first moment is masked: the gradients just
    sent stop pushing it. With ``"restart"`` that coordinate's bias
    correction restarts too, so its next direction is its gradient over
    ``sqrt(nu_hat)``, as a fresh Adam's first step (DGC's masked momentum
    restarts at the full gradient); ``"zero"`` only zeroes ``mu`` (the next
    direction is then ``1 - b1`` of that); ``"off"`` is
    ``optax.chain(optax.scale_by_adam(b1, b2, eps), sync)``.

    A coordinate sent in consecutive steps (or every coordinate in a dense
    warm-up phase of the sync) held nothing back, so its momentum is kept:
    Adam runs as in the dense case there. A sync without a residual
    (``dense_sync``, ``block_sync``) masks nothing.

    Cost: more local work than ``chain(sync, adamw)``: the Adam moments live in
    the sync's flat layout, which XLA:CPU computes in ~11 passes over the N
    floats (the gradient concatenated, ``mu``, ``nu`` and the direction in
    separate fusions, the direction cut into leaves and concatenated again by
    the sync) where AdamW after the sync is one fused pass per leaf, and the
    masking adds the per-entry ``age`` and a comparison of the residual before
    and after. On the 10.9M-parameter LM at P = 4 that is ~0.35-0.45 s a step
    on a 2-core machine (``benchmarks/README.md`` §8), enough to cancel the
    sparse wire's saving at 1 Gbit/s there.

    Put the weight decay and learning rate after it:
    ``optax.chain(jss.adam_direction_sync(jss.topk_sync(density=0.01)),
    optax.add_decayed_weights(wd), optax.scale_by_learning_rate(lr))``
    is AdamW on the synced directions. Replicas stay bitwise identical: the
    update is the sync's output, the same on every rank.

    Args:
      sync: the sync transformation (``jss.topk_sync(...)``,
        ``jss.oktopk_sync(...)``, or any whose state has the flat ``residual``
        this rank has not sent yet; others mask nothing).
      b1: decay of the first moment.
      b2: decay of the second moment.
      eps: added to ``sqrt(nu_hat)``.
      momentum_masking: one of :data:`MOMENTUM_MASKINGS`.

    Returns:
      An ``optax.GradientTransformation`` whose state is
      :class:`AdamDirectionSyncState` (``state.last_stats`` reads the sync's).

    Example:
      >>> import jax.numpy as jnp, optax, jax_sparse_sync as jss
      >>> tx = optax.chain(jss.adam_direction_sync(jss.topk_sync(k=1), eps=0.1),
      ...                  optax.scale_by_learning_rate(1.0))
      >>> params = {"w": jnp.zeros(3)}
      >>> state = tx.init(params)
      >>> for step in range(3):
      ...     updates, state = tx.update({"w": jnp.array([0.1, -2.0, 1.0])}, state, params)
      ...     print([round(float(u), 3) + 0.0 for u in updates["w"]], state[0].age.tolist())
      [0.0, 0.952, 0.0] [1.0, 1.0, 1.0]
      [0.0, 0.0, -1.818] [2.0, 2.0, 0.0]
      [0.0, 1.905, 0.0] [3.0, 0.0, 1.0]

      Entry 2, held back at step 1 and sent at step 2 (two directions), has its
      momentum restarted (age 0); entry 1 likewise at step 3.
    """
    if momentum_masking not in MOMENTUM_MASKINGS:
        raise ValueError(f"jax_sparse_sync.adam_direction_sync: `momentum_masking` must be one of "
                         f"{MOMENTUM_MASKINGS}, got {momentum_masking!r}")
    for name, value in (("b1", b1), ("b2", b2)):
        if not 0.0 <= value < 1.0:
            raise ValueError(f"jax_sparse_sync.adam_direction_sync: `{name}` must be in [0, 1), "
                             f"got {value}")
    if not eps > 0.0:
        raise ValueError(f"jax_sparse_sync.adam_direction_sync: `eps` must be positive, got {eps}")

    def init(params):
        n = flat_size(params)

        def zeros():  # separate buffers: a jitted step may donate the state
            return jnp.zeros((n,), jnp.float32)

        return AdamDirectionSyncState(jnp.zeros((), jnp.int32), zeros(), zeros(), zeros(),
                                      sync.init(params))

    def update(updates, state, params=None):
        g = ravel_leaves(updates, jnp.float32)
        if g.shape != state.mu.shape:
            raise ValueError(f"jax_sparse_sync.adam_direction_sync: the gradient has "
                             f"{g.shape[0]} entries but the state {state.mu.shape[0]}; was it "
                             "initialised for other parameters?")
        count = state.count + 1
        t = count.astype(jnp.float32)
        mu = b1 * state.mu + (1.0 - b1) * g
        nu = b2 * state.nu + (1.0 - b2) * g * g
        age = state.age + 1.0
        correction = 1.0 - b1 ** (age if momentum_masking == "restart" else t)
        direction = (mu / correction) / (jnp.sqrt(nu / (1.0 - b2 ** t)) + eps)
        synced, sync_state = sync.update(split_like(direction, updates), state.sync, params)
        before = getattr(state.sync, "residual", None)
        after = getattr(sync_state, "residual", None)
        if momentum_masking != "off" and after is not None and before is not None \
                and jnp.shape(after) == g.shape and jnp.shape(before) == g.shape:
            # sent now, after being held back: the momentum carries what just went out
            masked = (after == 0) & (before != 0)
            mu = jnp.where(masked, 0.0, mu)
            age = jnp.where(masked, 0.0, age)
        return synced, AdamDirectionSyncState(count, mu, nu, age, sync_state)

    return optax.GradientTransformation(init, update)
