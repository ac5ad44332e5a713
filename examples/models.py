"""Flax models shared by the examples and the benchmarks.

* :class:`TransformerLM`: a byte-level decoder-only language model (vocabulary 256,
  learned positions, pre-LayerNorm blocks of causal multi-head attention and a GELU
  MLP). :data:`LM_CONFIG` (d_model 384, 6 blocks of 6 heads, MLP ratio 4, sequence
  128) has 10,893,568 parameters in 102 leaves.
* :class:`ResNet`: a ResNet-style CNN of many small layers (a stride-2 stem, stages of
  residual blocks of conv + LayerNorm twice, global average pooling, a dense head).
  :data:`CNN_CONFIG` (widths 32, 64, 128; 3 blocks per stage; 32x32x3 inputs; 10
  classes) has 1,085,706 parameters in 80 leaves.

``examples/train_lm.py``, ``examples/train_resnet.py``, ``benchmarks/step_time.py``
(``build_model("transformer" | "cnn", cfg)``) and ``benchmarks/convergence.py`` all
build these classes, so the step times measured by ``step_time.py`` are those of the
models the convergence runs train. Parameter names (``Block_0``, ``ResBlock_3``, ...)
and therefore the initial parameters of a given key are fixed by the class names:
rename a class and every seeded run changes.

The configs are plain dicts with the keys ``step_time.model_config`` uses (``batch``
is per rank there; the models ignore it).
"""

from __future__ import annotations

import hashlib
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

#: the step_time.py transformer (``--tf-dim 384 --tf-heads 6 --tf-layers 6 --tf-seq 128``)
LM_CONFIG: dict[str, Any] = {"vocab": 256, "dim": 384, "heads": 6, "layers": 6,
                             "mlp_ratio": 4, "seq": 128}
#: the step_time.py cnn (``--cnn-widths 32 64 128 --cnn-blocks 3``, 32x32x3 inputs)
CNN_CONFIG: dict[str, Any] = {"widths": (32, 64, 128), "blocks": 3, "image": 32,
                              "classes": 10}


class Block(nn.Module):
    """One pre-LayerNorm transformer block: causal self-attention, then a GELU MLP."""

    dim: int
    heads: int
    mlp_ratio: int

    @nn.compact
    def __call__(self, x: jax.Array, mask: jax.Array) -> jax.Array:
        h = nn.LayerNorm()(x)
        h = nn.MultiHeadDotProductAttention(num_heads=self.heads, qkv_features=self.dim)(
            h, h, mask=mask)
        x = x + h
        h = nn.Dense(self.mlp_ratio * self.dim)(nn.LayerNorm()(x))
        return x + nn.Dense(self.dim)(nn.gelu(h))


class TransformerLM(nn.Module):
    """Byte-level decoder-only LM: ``tokens (B, T) int32 -> logits (B, T, vocab)``.

    Attributes:
      cfg: ``vocab``, ``dim``, ``heads``, ``layers``, ``mlp_ratio``, ``seq`` (the
        longest sequence: the size of the learned position table).
    """

    cfg: dict

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        cfg = self.cfg
        d = cfg["dim"]
        x = nn.Embed(cfg["vocab"], d)(tokens)
        pos = self.param("pos", nn.initializers.normal(0.02), (cfg["seq"], d))
        x = x + pos[None, :tokens.shape[1]]
        mask = nn.make_causal_mask(tokens)
        for _ in range(cfg["layers"]):
            x = Block(d, cfg["heads"], cfg["mlp_ratio"])(x, mask)
        return nn.Dense(cfg["vocab"])(nn.LayerNorm()(x))


class ResBlock(nn.Module):
    """Residual block: (3x3 conv, LayerNorm, relu, 3x3 conv, LayerNorm) + shortcut, relu.

    The shortcut is a strided 1x1 conv where the width or the resolution changes.
    """

    features: int
    stride: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        h = nn.Conv(self.features, (3, 3), strides=self.stride)(x)
        h = nn.relu(nn.LayerNorm()(h))
        h = nn.LayerNorm()(nn.Conv(self.features, (3, 3))(h))
        if x.shape[-1] != self.features or self.stride != 1:
            x = nn.Conv(self.features, (1, 1), strides=self.stride)(x)
        return nn.relu(x + h)


class ResNet(nn.Module):
    """ResNet-style CNN: ``images (B, H, W, C) -> logits (B, classes)``.

    A stride-2 3x3 stem, then ``len(widths)`` stages of ``blocks`` residual blocks
    (the first block of every stage but the first halves the resolution), global
    average pooling and a dense layer. LayerNorm instead of BatchNorm: no batch
    statistics to keep in sync across ranks.

    Attributes:
      cfg: ``widths``, ``blocks``, ``classes``.
    """

    cfg: dict

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        cfg = self.cfg
        # a strided stem keeps the step short on 2 cores; the layer count, not the
        # FLOPs, is what this model is for (many small parameter leaves)
        x = nn.relu(nn.Conv(cfg["widths"][0], (3, 3), strides=2)(x))
        for stage, width in enumerate(cfg["widths"]):
            for b in range(cfg["blocks"]):
                x = ResBlock(width, 2 if (stage and b == 0) else 1)(x)
        return nn.Dense(cfg["classes"])(x.mean(axis=(1, 2)))


def lm_loss(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """Mean next-byte cross entropy in nats (``logits (B, T, V)``, ``targets (B, T)``)."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return -jnp.take_along_axis(logp, targets[..., None], axis=-1).mean()


# --------------------------------------------------------------------------- #
# Helpers shared by train_lm.py and train_resnet.py
# --------------------------------------------------------------------------- #
SYNCS = ("dense", "topk", "oktopk", "shared_support", "sharded")
#: ``--change`` of ``--sync sharded``: how an owner's change to its region travels
CHANGES = ("auto", "topk", "lazy", "dense")


def add_sync_arguments(parser) -> None:
    """Adds ``--sync``, ``--density``, ``--selection``, ``--algorithm``, ``--tau``,
    ``--refresh-every``, ..."""
    parser.add_argument("--sync", choices=SYNCS, default="topk",
                        help="gradient sync: dense_sync, topk_sync, oktopk_sync, "
                             "shared_support_sync (index-free Top-k) or sharded_sync (the "
                             "optimizer's state sharded over the ranks, ZeRO-style: the "
                             "model's AdamW runs inside it, on each rank's region; default "
                             "topk)")
    parser.add_argument("--change", choices=CHANGES, default="auto",
                        help="(sharded) how an owner's change to its region travels: its "
                             "top-k with its own error feedback, only the entries that "
                             "received gradient (lazy Adam), or dense; auto: the cost "
                             "model's pick (sharded_sync(change=); default auto)")
    parser.add_argument("--change-density", type=float, default=None,
                        help="(sharded, --change topk) the fraction of its region an owner "
                             "sends (sharded_sync(change_density=); default: the library's)")
    parser.add_argument("--density", type=float, default=0.01,
                        help="fraction of gradient entries kept per step (default 0.01)")
    parser.add_argument("--selection", choices=("exact", "threshold_reuse", "cyclic", "union"),
                        default=None,
                        help="local selection: exact top-k every step, Ok-Topk's threshold "
                             "reuse, or (topk) ScaleCom's cyclic local top-k: rank step mod P "
                             "picks the indices for every rank, or the union of every rank's "
                             "top-k summed over all ranks (default: exact for topk, "
                             "threshold_reuse for oktopk)")
    parser.add_argument("--algorithm", default="auto",
                        help="sparse allreduce of --sync topk (default auto)")
    parser.add_argument("--refresh-every", type=int, default=2,
                        help="(shared_support) steps between the sparse exchanges that "
                             "choose the shared support: shared_support_sync(refresh_every=) "
                             "(default 2)")
    parser.add_argument("--tau", type=int, default=32,
                        help="steps between exact threshold computations with threshold_reuse")
    parser.add_argument("--wire-dtype", choices=("float32", "bfloat16", "float16"),
                        default="float32",
                        help="dtype of the synced values on the wire: dense_sync(wire_dtype=) "
                             "or topk_sync(wire_dtype=) (the kept values; default float32)")
    parser.add_argument("--warmup-wire-dtype", choices=("same", "float32", "bfloat16", "float16"),
                        default="same",
                        help="(topk, with --dense-warmup / --density-ramp) the values' dtype on "
                             "the wire during the warm-up phases: topk_sync(warmup_wire_dtype=); "
                             "e.g. bfloat16 with the default --wire-dtype float32: the ramp's "
                             "dense-ish stages on a 16-bit wire, the sparse steps in float32 "
                             "(default same: as --wire-dtype, dense phases float32)")
    parser.add_argument("--index-encoding", choices=("int32", "auto"), default="int32",
                        help="(topk) the kept indices on the wire: int32, or per message the "
                             "smallest of a list, delta-coded bits and a bitmap "
                             "(topk_sync(index_encoding=); the same sums, fewer bytes)")
    parser.add_argument("--residual-decay", type=float, default=1.0,
                        help="(topk) multiply the residual by this each step before adding "
                             "the gradient: leaky error feedback (default 1.0: plain)")
    parser.add_argument("--residual-decay-steps", type=int, default=0,
                        help="(topk) with --residual-decay: the factor rises linearly to 1 "
                             "over this many steps, so the leak fades out (default 0: "
                             "constant)")


def residual_decay(args):
    """topk_sync's ``residual_decay``: a float, or a linear rise to 1 over
    ``--residual-decay-steps`` steps."""
    decay, steps = getattr(args, "residual_decay", 1.0), getattr(args, "residual_decay_steps", 0)
    if steps and decay != 1.0:
        return optax.linear_schedule(decay, 1.0, steps)
    return decay


def wire_dtype(args):
    """``--wire-dtype`` as the syncs' ``wire_dtype=`` (None for float32)."""
    name = getattr(args, "wire_dtype", "float32")
    return None if name == "float32" else jnp.dtype(name).type


def warmup_wire_dtype(args):
    """``--warmup-wire-dtype`` as topk_sync's ``warmup_wire_dtype=`` (None for same)."""
    name = getattr(args, "warmup_wire_dtype", "same")
    return None if name == "same" else jnp.dtype(name).type


def make_sync(args):
    """The Optax gradient-sync transform the command line asks for."""
    import jax_sparse_sync as jss

    if getattr(args, "residual_decay", 1.0) != 1.0 and args.sync != "topk":
        raise SystemExit(f"--residual-decay applies to --sync topk (got --sync {args.sync})")
    wire = wire_dtype(args)
    if getattr(args, "index_encoding", "int32") != "int32" and args.sync != "topk":
        raise SystemExit(f"--index-encoding applies to --sync topk (got --sync {args.sync})")
    if wire is not None and args.sync == "oktopk":
        raise SystemExit("--wire-dtype applies to --sync dense and topk (got --sync oktopk)")
    if args.sync == "sharded":  # the optimizer itself: sharded_optimizer builds it
        unsupported = [flag for flag, on in (
            ("--selection", args.selection not in (None, "exact")), ("--wire-dtype", wire),
            ("--dense-warmup / --density-ramp", warmup_phases(args)),
            ("--flush-every", getattr(args, "flush_every", 0)),
            ("--sync-what adam_direction", getattr(args, "sync_what", "") == "adam_direction"),
            ("--dense-below", getattr(args, "dense_below", 0))) if on]
        if unsupported:
            raise SystemExit(f"{', '.join(unsupported)}: not options of --sync sharded "
                             "(sharded_sync takes --density and --change)")
        return None
    if args.sync == "shared_support":
        unsupported = [flag for flag, on in (
            ("--selection", args.selection not in (None, "exact")), ("--wire-dtype", wire),
            ("--warmup-wire-dtype", warmup_wire_dtype(args)),
            ("--dense-warmup / --density-ramp", warmup_phases(args)),
            ("--flush-every", getattr(args, "flush_every", 0))) if on]
        if unsupported:
            raise SystemExit(f"{', '.join(unsupported)}: not options of --sync shared_support "
                             "(shared_support_sync takes --density, --refresh-every and "
                             "--algorithm)")
        return jss.shared_support_sync(density=args.density, refresh_every=args.refresh_every,
                                       algorithm=args.algorithm)
    warm_wire = warmup_wire_dtype(args)
    if warm_wire is not None and (args.sync != "topk" or not warmup_phases(args)):
        raise SystemExit("--warmup-wire-dtype applies to --sync topk with --dense-warmup or "
                         f"--density-ramp (got --sync {args.sync})")
    if args.sync == "dense":
        return jss.dense_sync(wire_dtype=wire)
    if args.sync == "topk":
        return jss.topk_sync(density=args.density, algorithm=args.algorithm, wire_dtype=wire,
                             index_encoding=getattr(args, "index_encoding", "int32"),
                             warmup_wire_dtype=warm_wire,
                             selection=args.selection or "exact", tau=args.tau,
                             warmup=warmup_phases(args) or None,
                             flush_every=getattr(args, "flush_every", 0) or None,
                             residual_decay=residual_decay(args))
    return jss.oktopk_sync(density=args.density, tau=args.tau,
                           selection=args.selection or "threshold_reuse",
                           warmup=warmup_phases(args) or None,
                           flush_every=getattr(args, "flush_every", 0) or None)


def dense_small_leaves(args, sync, wrap=lambda s: s):
    """``wrap(sync)``, or with ``--dense-below S`` an ``optax.partition`` that gives the
    leaves of fewer than S entries (biases, LayerNorm / BatchNorm scales) to
    ``wrap(jss.dense_sync())`` and the others to ``wrap(sync)``: each part has its own
    state (its own Adam moments and residual with ``wrap`` = adam_direction_sync)."""
    import jax_sparse_sync as jss

    below = getattr(args, "dense_below", 0)
    if not below or args.sync == "dense":
        return wrap(sync)

    def labels(params):
        return jax.tree_util.tree_map(lambda p: "small" if p.size < below else "large", params)

    return optax.partition({"small": wrap(jss.dense_sync()), "large": wrap(sync)}, labels)


def sharded_optimizer(args, inner: optax.GradientTransformation,
                      max_grad_norm: float | None = None) -> optax.GradientTransformation:
    """``--sync sharded``: ``inner`` (the model's AdamW) run by ``jss.sharded_sync`` on each
    rank's region of the parameters, with its state there; the reduced gradient clipped by
    its global norm first (``max_grad_norm``), as ``chain(sync, clip_by_global_norm, adamw)``
    clips the synced gradient."""
    import jax_sparse_sync as jss

    return jss.sharded_sync(inner, density=args.density, change=args.change,
                            change_density=getattr(args, "change_density", None),
                            max_grad_norm=max_grad_norm)


def sync_stats(opt_state):
    """The step's wire statistics (``jss.SyncStats._fields`` vector) of the sync(s) in an
    optax state (``jss.last_stats``: with several, e.g. ``--dense-below``, the largest
    sender's, its bytes and messages summed over all of them)."""
    import jax_sparse_sync as jss

    return jss.last_stats(opt_state)


def warmup_phases(args) -> tuple:
    """``--dense-warmup`` / ``--density-ramp`` as the sync's ``warmup=`` phases (() if none)."""
    import jax_sparse_sync as jss

    if args.sync == "dense":
        return ()
    phases = jss.density_ramp(args.density, steps_per_stage=getattr(args, "density_ramp", 0),
                              dense_steps=getattr(args, "dense_warmup", 0))
    start = getattr(args, "ramp_start", 1.0)
    # --ramp-start: the ramp's stages above it left out (a ramp starting sparser)
    return tuple(p for p in phases if p[1] >= 1.0 or p[1] <= start * (1.0 + 1e-9))


def sync_label(args) -> str:
    """``dense``, ``topk 1% exact``, ``oktopk 0.1% threshold_reuse``, ..."""
    wire = getattr(args, "wire_dtype", "float32")
    wire = "" if wire == "float32" else f", {wire} wire"
    warm = getattr(args, "warmup_wire_dtype", "same")
    wire += "" if warm == "same" else f", warm-up on a {warm} wire"
    if args.sync == "dense":
        return f"dense{wire}"
    if args.sync == "shared_support":
        return f"shared_support {100 * args.density:g}% refresh_every={args.refresh_every}"
    if args.sync == "sharded":
        density = getattr(args, "change_density", None)
        return (f"sharded {100 * args.density:g}% change={args.change}"
                + ("" if density is None else f" change_density={density:g}"))
    selection = args.selection or ("exact" if args.sync == "topk" else "threshold_reuse")
    return f"{args.sync} {100 * args.density:g}% {selection}{wire}"


def params_digest(params) -> str:
    """SHA-256 of all parameter bytes, leaves in ``jax.tree_util`` order."""
    h = hashlib.sha256()
    for leaf in jax.tree_util.tree_leaves(params):
        h.update(np.asarray(leaf).tobytes())
    return h.hexdigest()


def add_warmup_argument(parser) -> None:
    """Adds ``--sync-what``, ``--dense-warmup`` and ``--density-ramp``."""
    parser.add_argument("--sync-what", choices=("gradient", "adam_direction"), default="gradient",
                        help="what the sync sends: the gradient (chain(sync, adamw): Adam sees "
                             "the synced sparse sum; default) or each rank's own Adam "
                             "direction (chain(scale_by_adam, sync, ...): per-rank Adam "
                             "moments of the local gradient, the directions synced sparsely)")
    parser.add_argument("--mask-momentum", choices=("off", "zero", "restart"), default="off",
                        help="with --sync-what adam_direction: DGC's momentum factor masking "
                             "(jss.adam_direction_sync(sync, momentum_masking=...)): Adam's "
                             "first moment zeroed where this rank sent what it had held back "
                             "(restart: and its bias correction restarted; default off)")
    parser.add_argument("--lr-before-sync", action="store_true",
                        help="with --sync-what adam_direction: the learning rate scales each "
                             "direction before the sync (jss.adam_direction_sync(..., "
                             "learning_rate=schedule)), so the residual holds scaled steps "
                             "as in error-feedback SGD; default: after the sync")
    parser.add_argument("--second-moment", choices=("rank", "mean"), default="rank",
                        help="with --sync-what adam_direction: divide by each rank's own "
                             "gradient's second moment (rank, default) or by an estimate of "
                             "the mean gradient's (mean: jss.adam_direction_sync(..., "
                             "second_moment='mean'), so the averaged directions are dense "
                             "Adam's where the noise dominates)")
    parser.add_argument("--second-moment-warmup", type=int, default=0, metavar="STEPS",
                        help="with --second-moment mean: the correction grows linearly "
                             "over STEPS steps (second_moment_warmup=STEPS; default 0)")
    parser.add_argument("--dense-below", type=int, default=0, metavar="S",
                        help="sparse syncs: leaves with fewer than S entries (biases, norm "
                             "scales) synced densely, each part with its own state "
                             "(optax.partition; default 0: every leaf sparsely)")
    parser.add_argument("--dense-warmup", type=int, default=0, metavar="STEPS",
                        help="sparse syncs: a dense allreduce for the first STEPS steps (the "
                             "sync's warmup=[(STEPS, 1.0)]; the residual comes out zero), then "
                             "--sync (default 0: off)")
    parser.add_argument("--density-ramp", type=int, default=0, metavar="STEPS",
                        help="sparse syncs: DGC's warm-up after any --dense-warmup, "
                             "densities 1/4, 1/16, ... down to --density, STEPS steps each "
                             "(jss.density_ramp; default 0: off)")
    parser.add_argument("--ramp-start", type=float, default=1.0, metavar="D",
                        help="with --density-ramp: leave out the ramp's stages denser than D "
                             "(e.g. 0.07: start at 6.25 %% instead of 25 %%; default 1: all)")
    parser.add_argument("--flush-every", type=int, default=0, metavar="F",
                        help="sparse syncs: every F-th step a dense allreduce of the "
                             "accumulator (the sync's flush_every=F: what the residuals held "
                             "back is applied, averaged over the ranks; F = --steps: once, at "
                             "the last step; default 0: off)")


def add_schedule_argument(parser) -> None:
    """Adds ``--decay-steps``: where the learning rate's cosine decay ends."""
    parser.add_argument("--decay-steps", type=int, default=None, metavar="STEPS",
                        help="the cosine decay reaches its end value at step STEPS and "
                             "holds it after (default: --steps). A shorter schedule is a "
                             "training budget: e.g. a sparse run asked to reach dense's "
                             "final metric sooner than dense's own schedule")


def lr_schedule(args, end_value: float):
    """The examples' learning rate: a linear warm-up from 0 to ``--lr`` over
    ``--warmup-steps``, then a cosine decay to ``end_value`` at ``--decay-steps``
    (default ``--steps``), held after it."""
    decay = args.steps if getattr(args, "decay_steps", None) is None else args.decay_steps
    if decay < 1:
        raise ValueError(f"--decay-steps must be a positive number of steps, got {decay}")
    return optax.warmup_cosine_decay_schedule(
        0.0, args.lr, warmup_steps=min(args.warmup_steps, decay),
        decay_steps=max(decay, args.warmup_steps + 1), end_value=end_value)


def adam_then_sync(args, sync, schedule, weight_decay: float,
                   max_grad_norm: float | None = None):
    """``--sync-what adam_direction``: AdamW on each rank's Adam direction synced by
    ``sync``, the learning rate ``schedule`` after the sync or (``--lr-before-sync``)
    before it, the decoupled ``weight_decay`` scaled by the same rate either way; a
    list of transforms to put in the optimizer's ``optax.chain`` (:func:`sync_stats`
    finds the sync's state in it). ``max_grad_norm``: the gradient clipped by its
    global norm first, as ``optax.clip_by_global_norm`` in front would: inside the
    fused Adam pass (``adam_direction_sync(max_grad_norm=...)``, the same bits without
    the clipped gradient's write), or with ``--dense-below`` (two Adam passes, the
    norm over both parts) by that transform."""
    import jax_sparse_sync as jss

    rate = schedule if args.lr_before_sync else None
    partitioned = bool(getattr(args, "dense_below", 0)) and args.sync != "dense"
    folded = None if partitioned else max_grad_norm

    def adam_direction(s):
        return jss.adam_direction_sync(s, momentum_masking=args.mask_momentum,
                                       learning_rate=rate,
                                       second_moment=getattr(args, "second_moment", "rank"),
                                       second_moment_warmup=getattr(
                                           args, "second_moment_warmup", 0),
                                       max_grad_norm=folded)

    direction = dense_small_leaves(args, sync, adam_direction)
    clip = ([optax.clip_by_global_norm(max_grad_norm)]
            if max_grad_norm is not None and partitioned else [])
    if not args.lr_before_sync:
        return [*clip, direction, optax.add_decayed_weights(weight_decay),
                optax.scale_by_learning_rate(schedule)]
    decay = optax.inject_hyperparams(optax.add_decayed_weights)(
        weight_decay=lambda count: weight_decay * schedule(count))
    return [*clip, direction, decay, optax.scale(-1.0)]



# --------------------------------------------------------------------------- #
# DiLoCo's outer step (--every H): jss.diloco around the model's own optimizer
# --------------------------------------------------------------------------- #
#: ``--outer-sync``: the sync of the pseudo-gradient at each outer step
OUTER_SYNCS = ("dense", "dense_bf16", "topk", "chunked_topk")


def add_outer_step_arguments(parser) -> None:
    """Adds ``--every``, ``--outer-sync``, ``--fragments`` and the outer step's options."""
    parser.add_argument("--every", type=int, default=0, metavar="H",
                        help="DiLoCo: H local steps of the model's optimizer with no "
                             "communication, then an outer step: the parameters' change "
                             "since the last one averaged by --outer-sync and applied by the "
                             "outer optimizer (jss.diloco(..., every=H)); the per-step --sync "
                             "options are then unused (default 0: sync every step with --sync)")
    parser.add_argument("--outer-sync", choices=OUTER_SYNCS, default="dense",
                        help="(--every) the outer step's sync: dense_sync, dense_sync on a "
                             "bfloat16 wire, error-fed topk_sync(density=--outer-density) or "
                             "SparseLoCo's chunked Top-k (jss.chunked_topk_sync: --outer-chunk, "
                             "--outer-density, --outer-bits) (default dense)")
    parser.add_argument("--outer-density", type=float, default=0.01,
                        help="(--outer-sync topk, chunked_topk) fraction of the pseudo-"
                             "gradient's entries sent per outer step (default 0.01)")
    parser.add_argument("--outer-chunk", type=int, default=4096,
                        help="(--outer-sync chunked_topk) entries per chunk (default 4096)")
    parser.add_argument("--outer-bits", type=int, choices=(2, 4, 8, 16, 32), default=2,
                        help="(--outer-sync chunked_topk) bits of each sent value: 2, 4, 8 "
                             "(a scale per chunk), 16 (bfloat16) or 32 (float32) (default 2)")
    parser.add_argument("--outer-lr", type=float, default=None,
                        help="(--every) the outer optimizer's learning rate (default: 0.7 "
                             "with Nesterov momentum 0.9 for the dense outer syncs, DiLoCo's; "
                             "1.0 without momentum for topk and chunked_topk, SparseLoCo's: "
                             "their error feedback takes the momentum's place)")
    parser.add_argument("--outer-momentum", type=float, default=None,
                        help="(--every) the outer optimizer's Nesterov momentum; 0: plain SGD "
                             "(default: 0.9 dense, 0 topk / chunked_topk)")
    parser.add_argument("--outer-ef-decay", type=float, default=1.0,
                        help="(--outer-sync topk, chunked_topk) each outer step the residual is "
                             "multiplied by this before the pseudo-gradient is added (the "
                             "sync's residual_decay; default 1.0: plain error feedback)")
    parser.add_argument("--fragments", type=int, default=1, metavar="F",
                        help="(--every) Streaming DiLoCo: F fragments of consecutive leaves "
                             "of about equal size take turns, H/F steps apart, each outer "
                             "step sending 1/F of the model (default 1)")
    parser.add_argument("--delay", type=int, default=0, metavar="TAU",
                        help="(--every) a fragment is merged TAU steps after its outer step "
                             "(Streaming DiLoCo's tau; the exchange itself is blocking; "
                             "default 0)")
    parser.add_argument("--mix", type=float, default=0.0,
                        help="(--every) the local parameters' weight in a merge (Streaming "
                             "DiLoCo's alpha; 0: replaced by the shared ones, default)")


def outer_sync_label(args) -> str:
    """``diloco H=30 dense_bf16``, ``diloco H=100 chunked_topk 1% 2-bit F=4``, ..."""
    sync = args.outer_sync
    if sync in ("topk", "chunked_topk"):
        sync += f" {100 * args.outer_density:g}%"
    if args.outer_sync == "chunked_topk":
        sync += f" {args.outer_bits}-bit chunk {args.outer_chunk}"
    extra = f" F={args.fragments}" if args.fragments != 1 else ""
    extra += f" delay={args.delay}" if args.delay else ""
    extra += f" mix={args.mix:g}" if args.mix else ""
    return f"diloco H={args.every} {sync}{extra}"


def make_outer_sync(args):
    """The sync of ``--outer-sync``."""
    import jax_sparse_sync as jss

    decay = getattr(args, "outer_ef_decay", 1.0)
    if decay != 1.0 and args.outer_sync not in ("topk", "chunked_topk"):
        raise SystemExit("--outer-ef-decay applies to --outer-sync topk and chunked_topk")
    if args.outer_sync == "dense":
        return jss.dense_sync()
    if args.outer_sync == "dense_bf16":
        return jss.dense_sync(wire_dtype=jnp.bfloat16)
    if args.outer_sync == "topk":
        return jss.topk_sync(density=args.outer_density, residual_decay=decay)
    values = ({"value_bits": args.outer_bits} if args.outer_bits <= 8 else
              {"value_dtype": jnp.bfloat16 if args.outer_bits == 16 else jnp.float32})
    return jss.chunked_topk_sync(chunk=args.outer_chunk, density=args.outer_density,
                                 residual_decay=decay, **values)


def outer_optimizer(args) -> optax.GradientTransformation:
    """``--outer-lr`` / ``--outer-momentum``, defaulting per ``--outer-sync`` (see --help)."""
    sparse = args.outer_sync in ("topk", "chunked_topk")
    lr = args.outer_lr if args.outer_lr is not None else (1.0 if sparse else 0.7)
    momentum = args.outer_momentum if args.outer_momentum is not None else (
        0.0 if sparse else 0.9)
    if momentum:
        return optax.sgd(lr, momentum=momentum, nesterov=True)
    return optax.sgd(lr)


def make_diloco(args, inner: optax.GradientTransformation) -> optax.GradientTransformation:
    """``jss.diloco(inner, outer, every=--every, sync=--outer-sync, fragments=...)``: the
    model's optimizer (with no sync in it) as the inner one."""
    import jax_sparse_sync as jss

    conflicts = [flag for flag, on in (
        ("--sync-what adam_direction", getattr(args, "sync_what", "gradient") != "gradient"),
        ("--dense-below", getattr(args, "dense_below", 0))) if on]
    if conflicts:
        raise SystemExit(f"{', '.join(conflicts)}: options of the per-step sync, not of "
                         f"--every (the inner steps have no sync)")
    return jss.diloco(inner, outer_optimizer(args), every=args.every,
                      sync=make_outer_sync(args), fragments=args.fragments, delay=args.delay,
                      mix=args.mix)


def shared_params(params, opt_state):
    """The parameters every rank agrees on: under ``--every`` the DiLoCo anchor (the
    model of the last outer step; the working parameters differ between outer steps),
    else ``params``."""
    import jax_sparse_sync as jss

    return opt_state.anchor if isinstance(opt_state, jss.DiLoCoState) else params
