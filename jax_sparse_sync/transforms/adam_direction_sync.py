"""Adam in front of a sparse sync, with DGC's momentum factor masking.

``optax.chain(jss.topk_sync(...), optax.adam(...))`` makes Adam see the synced
sparse sum, where a coordinate sent every T steps arrives as one spike of ~T
gradients that Adam's second moment shrinks: sparse runs learn far slower than
dense. Syncing each rank's own Adam direction instead
(``chain(scale_by_adam(), sync, ...)``) closes most of that gap, but leaves
one: a coordinate's accumulated directions go on the wire while its first
moment still holds the gradients just sent, so they keep pushing it for ~1/(1-b1)
more steps. DGC (Lin et al., ICLR 2018, Section 3.2) masks the momentum where a
coordinate was sent; :func:`adam_direction_sync` does that for Adam's first
moment, restarting that coordinate's bias correction so its next direction has
full size (as DGC's masked momentum ``u = g`` has).

The step's phases: :func:`begin` (the state checked, the pass's inputs read),
the Adam pass fused into the sync's accumulator (:func:`fused_step`) or before
it (:func:`unfused_step`), the sync, and the new state.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jax_sparse_sync.bindings.adam import AGE_DTYPE, pending_mask
from jax_sparse_sync.ops import transport
from jax_sparse_sync.transforms.accumulator_source import FlatSyncTransformation
from jax_sparse_sync.transforms.adam_accumulate import adam_source
from jax_sparse_sync.transforms.adam_direction_config import (MOMENTUM_MASKINGS, SECOND_MOMENTS,
                                                              AdamDirectionConfig)
from jax_sparse_sync.transforms.adam_pass import (adam_direction_pass, as_ages, clip_leaves,
                                                  global_norm, mean_moment_pass)
from jax_sparse_sync.transforms.flat import flat_size, split_like

__all__ = ["AdamDirectionSyncState", "adam_direction_sync", "MOMENTUM_MASKINGS", "SECOND_MOMENTS"]


class AdamDirectionSyncState(NamedTuple):
    """State of :func:`adam_direction_sync`: arrays only, it checkpoints with the optimizer.

    Attributes:
      count: steps taken (int32).
      mu: this rank's first moment of its own gradient, flat (N,) float32 in
        ``jax.tree_util`` order (the sync's residual layout).
      nu: this rank's second moment, flat (N,) float32.
      age: steps since each coordinate's first moment was last masked, flat
        (N,) int16 saturating at 32767 (its bias correction is ``1 - b1**age``,
        1.0 in float32 long before that for the ``b1`` accepted), negative where
        the sync's residual held something before this step's sync: the
        masking is applied lazily, at the start of the next step (a negative
        age whose residual is now zero was sent after being held back), so
        one pass does it; :meth:`moments` gives ``mu`` and ``age`` with it
        applied.
      sync: the inner sync transform's state (residual, wire statistics).
      noise: with ``second_moment="mean"``, three flat (N,) float32: the
        second moment of this rank's gradients' second difference, its last
        gradient and the one before; else ``None``.

    ``mu``, ``nu``, ``age`` and the sync's residual differ from rank to rank:
    checkpoint them per rank, like the residual. A state saved by versions
    that masked right after the sync (ages never negative) loads and
    continues exactly; one with float32 ages (versions before the int16
    ages) continues too, its ages converted at its first step.
    """

    count: jax.Array
    mu: jax.Array
    nu: jax.Array
    age: jax.Array
    sync: Any
    noise: Any = None

    @property
    def last_stats(self):
        """The inner sync's ``last_stats`` (the step's wire statistics)."""
        return self.sync.last_stats

    def moments(self):
        """``(mu, age)`` after the last step with its pending masks applied: the
        first moment and the steps since each coordinate's last mask, as if the
        masking ran right after the sync."""
        residual = _flat_residual_or_none(self.sync, self.mu.shape[0])
        age = jnp.abs(self.age)
        if residual is None:
            return self.mu, age
        sent = pending_mask(self.age, residual)
        return jnp.where(sent, 0.0, self.mu), jnp.where(sent, jnp.zeros_like(age), age)


def _manual_mesh_axes() -> tuple:
    """The mesh axes being traced over by shard_map or pmap (empty outside them)."""
    get = getattr(jax.sharding, "get_abstract_mesh", None)
    mesh = get() if get is not None else None
    return tuple(getattr(mesh, "manual_axes", ()) or ())


def adam_direction_sync(sync: optax.GradientTransformation, *, b1: float = 0.9,
                        b2: float = 0.999, eps: float = 1e-8,
                        momentum_masking: str = "restart",
                        learning_rate: float | optax.Schedule | None = None,
                        second_moment: str = "rank", nranks: int | None = None,
                        second_moment_warmup: int = 0,
                        max_grad_norm: float | None = None,
                        ) -> optax.GradientTransformation:
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

    Cost: one pass over the N floats on CPU (``jss_adam_direction``, an FFI
    kernel on all cores: the gradient read from its leaves' own buffers, the
    moments and ``age`` updated in place, the masking of the last step folded
    in); on GPU the same arithmetic in ``jax.numpy`` (XLA fuses it there). In
    front of ``topk_sync`` or ``oktopk_sync`` (float32 residual and gradient)
    that pass also writes the sync's accumulator, ``residual + direction``,
    into the residual's buffer (``jss_adam_accumulate``, with ``topk_sync``'s
    exact top-k listed from it while in cache): the direction is never
    written, cut into leaves, or read back, and the step is the unfused one
    bit for bit. Adam's directions all have magnitudes near 1 (exactly 1 at
    the first step), which the exact top-k selects through its path for
    concentrated magnitudes. Measurements: docs/topics/adam_direction.md.

    Put the weight decay and learning rate after it:
    ``optax.chain(jss.adam_direction_sync(jss.topk_sync(density=0.01)),
    optax.add_decayed_weights(wd), optax.scale_by_learning_rate(lr))``
    is AdamW on the synced directions. Replicas stay bitwise identical: the
    update is the sync's output, the same on every rank.

    Args:
      sync: the sync transformation (``jss.topk_sync(...)``,
        ``jss.oktopk_sync(...)``, ``jss.grouped_topk_sync(plan, ...)`` (the
        Adam pass then runs group by group, each group's as soon as its
        gradients exist, with the plan's overlap; ramps and flushes included),
        or any whose state has the flat ``residual`` this rank has not sent
        yet; others mask nothing).
      b1: decay of the first moment.
      b2: decay of the second moment.
      eps: added to ``sqrt(nu_hat)``.
      momentum_masking: one of :data:`MOMENTUM_MASKINGS`. Masking reads a
        sent entry as one whose residual is exactly zero, so with it a sync on a
        16-bit wire (``wire_dtype``) drops the rounding of the values it sends
        instead of keeping it in the residual (where the sync takes the flat
        entry point: float32 gradients, ``topk_sync`` / ``oktopk_sync`` /
        ``grouped_topk_sync``).
      learning_rate: ``None`` (default) syncs the direction itself: put the
        learning rate after this transform. A float or an ``optax`` schedule
        (called with the 0-based step, like ``optax.scale_by_learning_rate``)
        scales the direction *before* the sync, so the sync's residual holds
        learning-rate-scaled steps, as error feedback's analysis assumes
        (EF-SGD: ``e + lr * g`` is compressed): a coordinate held back while
        the rate decays moves by the rates of the steps that computed it, not
        by the rate of the step that sends it. Then follow it with the
        decoupled weight decay scaled by the same rate and ``optax.scale(-1)``
        (see the example below); identical to putting the rate after for any
        linear sync (``dense_sync``).
      second_moment: ``"rank"`` (default): each rank's Adam divides by its own
        gradient's second moment. Where the gradient noise dominates, that
        holds one rank's batch noise, P times the mean gradient's, so the
        average of the P directions is dense Adam's direction shrunk by up to
        ``sqrt(P)``. ``"mean"``: divide by an estimate of the mean gradient's
        second moment, ``nu_hat - (1 - 1/P) sigma_hat^2`` (at least
        ``nu_hat / P``), with ``sigma_hat^2`` a sixth of the second moment of
        the gradient's second difference ``g_t - 2 g_{t-1} + g_{t-2}``
        (``state.noise``: three more (N,) buffers); no communication. On CPU
        in the same one-pass kernel, elsewhere in ``jax.numpy``. See
        :func:`~jax_sparse_sync.transforms.adam_pass.mean_moment_pass`.
        Its larger steps cost while the signal dominates (early) and pay when
        the noise does (late): see ``second_moment_warmup``.
      nranks: P for ``second_moment="mean"``: the number of ranks the sync
        averages over. ``None``: the size of the library's default
        communicator (``jss.mpi.default_comm()``, read when the update is traced);
        pass it when the sync has its own ``comm``. Inside shard_map / pmap
        it is required (a ``ValueError`` says so): the mesh axes' size is not
        the MPI communicator's.
      second_moment_warmup: with ``second_moment="mean"``, the steps over
        which the correction grows linearly from none (this rank's own second
        moment) to full: at step t it subtracts ``min(1, t / W) (1 - 1/P)
        sigma_hat^2`` (floor ``nu_hat (1 - that factor)``). 0 (default): full
        from the first step. The corrected, larger steps cost while the
        signal dominates (early) and pay when the noise does (late).
      max_grad_norm: ``None`` (default), or clip the gradient by its global norm
        first: ``adam_direction_sync(sync, max_grad_norm=c)`` is
        ``optax.chain(optax.clip_by_global_norm(c), adam_direction_sync(sync))``
        bit for bit. On the fused CPU path the clipping is applied inside the
        Adam pass (the norm is still computed first, over the whole gradient),
        so the clipped gradient is never written and read back: one N-float
        write and read less a step. Under
        ``grouped_topk_sync`` the first group's pass then waits for the whole
        gradient (the norm), as it would behind ``clip_by_global_norm``.

    Donate the optimizer state (``jax.jit(step, donate_argnums=(0, 1))``): the
    sync updates its N-float buffers in place, which a plain ``jax.jit`` copies
    every step (see :func:`jss.topk_sync`);
    :func:`jss.check_donation` tells (once) which buffers a step copies.

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
      ...     age = state[0].moments()[1]  # with the pending masks applied
      ...     print([round(float(u), 3) + 0.0 for u in updates["w"]], age.tolist())
      [0.0, 0.952, 0.0] [1, 1, 1]
      [0.0, 0.0, -1.818] [2, 2, 0]
      [0.0, 1.905, 0.0] [3, 0, 1]

      Entry 2, held back at step 1 and sent at step 2 (two directions), has its
      momentum restarted (age 0); entry 1 likewise at step 3.
    """
    config = AdamDirectionConfig(
        b1=b1, b2=b2, eps=eps, momentum_masking=momentum_masking, learning_rate=learning_rate,
        second_moment=second_moment, nranks=nranks, second_moment_warmup=second_moment_warmup,
        max_grad_norm=max_grad_norm)

    def init(params):
        return init_state(config, sync, params)

    def update(updates, state, params=None):
        return step(config, sync, updates, state, params)

    return optax.GradientTransformation(init, update)


class AdamInputs(NamedTuple):
    """A step's inputs to the Adam pass besides the gradient and the moments (phase 1)."""

    count: jax.Array  # this step's number, from 1
    age: jax.Array  # the state's ages as int16
    residual: Any  # the sync's flat residual before the step (the pending masks), or None
    rate: Any  # the learning rate before the sync, or None
    clip: Any  # (the gradient's global norm, max_grad_norm), or None: clipped in the pass
    nranks: int | None  # P for second_moment="mean", else None


def init_state(config: AdamDirectionConfig, sync, params) -> "AdamDirectionSyncState":
    """Zero moments and ages, the sync's own state, and with ``second_moment="mean"``
    the noise estimate's three buffers."""
    n = flat_size(params)

    def zeros():  # separate buffers: a jitted step may donate the state
        return jnp.zeros((n,), jnp.float32)

    return AdamDirectionSyncState(jnp.zeros((), jnp.int32), zeros(), zeros(),
                                  jnp.zeros((n,), AGE_DTYPE), sync.init(params),
                                  (zeros(), zeros(), zeros()) if config.mean else None)


def step(config: AdamDirectionConfig, sync, updates, state, params):
    """One step: begin -> the Adam pass and the sync (fused where the sync takes a
    source: one pass writes the moments and the sync's accumulator) -> the state."""
    inputs = begin(config, updates, state)
    if is_fused(sync, updates):
        return fused_step(config, sync, inputs, updates, state, params)
    return unfused_step(config, sync, inputs, updates, state, params)


def begin(config: AdamDirectionConfig, updates, state) -> AdamInputs:
    """Phase 1: the state checked against the gradient, the Adam pass's inputs read."""
    n = flat_size(updates)
    if (n,) != state.mu.shape:
        raise ValueError(f"jax_sparse_sync.adam_direction_sync: the gradient has "
                         f"{n} entries but the state {state.mu.shape[0]}; was it "
                         "initialised for other parameters?")
    count = state.count + 1
    age = as_ages(state.age)  # float32 ages (saved before they were int16) converted
    residual = _flat_residual_or_none(state.sync, n)
    rate = config.rate_at(state.count)  # before the sync: the residual holds scaled steps
    clip = None
    if config.max_grad_norm is not None:
        clip = (global_norm(updates), config.max_grad_norm)
    nranks = mean_moment_ranks(config, state.noise, n) if config.mean else None
    return AdamInputs(count, age, residual, rate, clip, nranks)


def mean_moment_ranks(config: AdamDirectionConfig, noise, n: int) -> int:
    """P for ``second_moment="mean"``, the state's noise buffers checked."""
    if isinstance(noise, tuple) and len(noise) == 2:
        raise ValueError("jax_sparse_sync.adam_direction_sync: this state's `noise` "
                         "holds two buffers, the first-difference estimate of an "
                         "earlier version; the second-difference estimate needs "
                         "three. Keep the rest and restart the estimate: "
                         "state._replace(noise=tx.init(params).noise)")
    if not (isinstance(noise, tuple) and len(noise) == 3
            and all(jnp.shape(x) == (n,) for x in noise)):
        raise ValueError("jax_sparse_sync.adam_direction_sync: second_moment='mean' "
                         "needs the state's `noise` buffer; initialise the state with "
                         "this transform (tx.init) rather than one built without it")
    manual_axes = _manual_mesh_axes() if config.nranks is None else ()
    if manual_axes:
        # the default communicator is MPI's; under shard_map / pmap the sync
        # most likely averages over mesh axes, whose size only the user knows here
        raise ValueError(
            "jax_sparse_sync.adam_direction_sync: second_moment='mean' inside "
            f"shard_map / pmap (mesh axes {manual_axes}) needs `nranks`: "
            "pass the number of ranks the sync averages over, e.g. "
            "adam_direction_sync(sync, second_moment='mean', "
            "nranks=mesh.shape['data'])")
    return config.nranks if config.nranks is not None else transport.comm_size_in_trace(
        transport.resolve_comm(None), "adam_direction_sync")


def is_fused(sync, updates) -> bool:
    """Whether the Adam pass runs inside the sync's accumulate pass: a sync with the
    flat entry point (``update_from``) and float32 gradient leaves."""
    return (getattr(sync, "update_from", None) is not None
            and all(jnp.result_type(x) == jnp.float32
                    for x in jax.tree_util.tree_leaves(updates)))


def fused_step(config: AdamDirectionConfig, sync: FlatSyncTransformation, inputs: AdamInputs,
               updates, state, params):
    """Phases 2-4, fused: one pass writes the moments, age and the sync's accumulator
    (in the residual's buffer); the direction never goes back into leaves."""
    source = adam_source(b1=config.b1, b2=config.b2, eps=config.eps,
                         masking=config.momentum_masking, mask=inputs.residual is not None,
                         nranks=inputs.nranks, warmup=config.second_moment_warmup)
    synced, sync_state, (mu, nu, age, new_noise) = sync.update_from(
        source, (updates, state.mu, state.nu, inputs.age,
                 state.noise if config.mean else None, inputs.count, inputs.rate,
                 inputs.clip), state.sync, params)
    return synced, AdamDirectionSyncState(inputs.count, mu, nu, age, sync_state,
                                          new_noise if config.mean else state.noise)


def unfused_step(config: AdamDirectionConfig, sync, inputs: AdamInputs, updates, state, params):
    """Phases 2-4: the Adam pass writes the direction, cut into the gradient's leaves
    for the sync's ``update``."""
    if inputs.clip is not None:  # the clipped gradient written (XLA)
        updates = clip_leaves(updates, *inputs.clip)
    adam = dict(b1=config.b1, b2=config.b2, eps=config.eps, masking=config.momentum_masking,
                scale=inputs.rate)
    noise = state.noise
    if config.mean:
        mu, nu, noise, age, direction = mean_moment_pass(
            updates, state.mu, state.nu, noise, inputs.age, inputs.residual, inputs.count,
            nranks=inputs.nranks, warmup=config.second_moment_warmup, **adam)
    else:
        mu, nu, age, direction = adam_direction_pass(
            updates, state.mu, state.nu, inputs.age, inputs.residual, inputs.count, **adam)
    synced, sync_state = sync.update(split_like(direction, updates), state.sync, params)
    return synced, AdamDirectionSyncState(inputs.count, mu, nu, age, sync_state, noise)


def _flat_residual_or_none(sync_state, n: int):
    """The sync's flat residual (what it has not sent yet), or None: a sync without
    one (``dense_sync``, ``block_sync``), or a residual saved as a tree by an older
    version (that step masks nothing; the sync returns it flat)."""
    residual = getattr(sync_state, "residual", None)
    if residual is None or jnp.shape(residual) != (n,):
        return None
    return jnp.asarray(residual).astype(jnp.float32)  # zero stays zero
