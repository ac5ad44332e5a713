"""step_time.py's modes: the grammar of their names (``topk_0.1pct_auto``,
``adamdir_6.25pct``, ...), what each keeps and runs, and the transform it times."""

from __future__ import annotations

ALGORITHMS = ("auto", "allgather", "recursive_doubling", "split_allgather",
              "dsar_split_allgather")
DENSITIES = {"1pct": 0.01, "0.1pct": 0.001}
ALL_MODES = (("none", "dense", "dense_bf16")
             + tuple(f"topk_{d}_{a}" for d in DENSITIES for a in ALGORITHMS)
             + tuple(f"oktopk_{d}" for d in DENSITIES)
             + tuple(f"adamdir_{d}" for d in DENSITIES) + ("psum",))
# what the psum job records (all for the one "psum" of --modes)
PSUM_MODES = ("psum_none", "psum", "psum_jss_dense")
NO_SYNC = ("none", "psum_none")
DENSE_KINDS = ("dense", "dense_bf16", "psum", "psum_jss_dense")
#: mode -> the sync's ``wire_dtype`` (the others send float32 values)
WIRE_DTYPES = {"dense_bf16": "bfloat16"}
PLOT_ORDER = ALL_MODES + ("psum_jss_dense",)
QUICK_MODES = ("none", "dense", "topk_1pct_auto")
#: mode kind -> the cost model's local-work kind (jss.planning.cost_model.LOCAL_WORK_KINDS)
#: (adamdir's Adam passes have no kind of their own: its prediction counts topk_sync's)
#: (psum_jss_dense is jss.dense_sync on the axis transport: the same transform's O(N)
#: passes, predicted with the calibration of the MPI job of the same repeat)
#: (dense_bf16 is priced with dense_sync's calibration, which is float32's: its two
#: roundings to bf16 are not in that term)
LOCAL_KIND = {"dense": "dense_sync", "dense_bf16": "dense_sync", "topk": "topk_sync",
              "oktopk": "oktopk_sync", "adamdir": "topk_sync", "psum_jss_dense": "dense_sync"}
LR = 0.01
#: ``--optimizer`` choices: what follows the sync in the timed step
OPTIMIZERS = ("sgd", "adamw")
WEIGHT_DECAY = 0.01


def parse_mode(mode: str) -> dict:
    """``{"kind", "density", "algorithm"}`` of a mode name such as ``"none"``, ``"dense"``,
    ``"dense_bf16"``, ``"topk_0.1pct_auto"``, ``"oktopk_1pct"``, ``"adamdir_6.25pct"`` or
    ``"psum"`` (kind: the name itself for the dense and no-sync modes, else topk, oktopk
    or adamdir); a ValueError for an unknown name."""
    if mode in ("none", "dense", "dense_bf16") + PSUM_MODES:
        return {"kind": mode, "density": None,
                "algorithm": "dense" if mode in DENSE_KINDS else None}
    parts = mode.split("_", 2)
    density = _density(parts[1]) if len(parts) > 1 else None
    if parts[0] == "topk" and len(parts) == 3 and density and parts[2] in ALGORITHMS:
        return {"kind": "topk", "density": density, "algorithm": parts[2]}
    if parts[0] == "oktopk" and len(parts) == 2 and density:
        return {"kind": "oktopk", "density": density, "algorithm": "oktopk"}
    if parts[0] == "adamdir" and len(parts) == 2 and density:
        return {"kind": "adamdir", "density": density, "algorithm": "auto"}
    raise ValueError(f"unknown mode {mode!r}; expected one of {', '.join(ALL_MODES)} "
                     "(or any density as <percent>pct, e.g. adamdir_6.25pct)")


def density_name(density: float) -> str:
    """A density as mode names spell it: 0.01 -> ``"1pct"``, 0.0625 -> ``"6.25pct"``."""
    return f"{100 * density:g}pct"


def _density(name: str) -> float | None:
    """``"1pct"`` -> 0.01, any ``"<percent>pct"`` in (0, 100]; None otherwise."""
    if name in DENSITIES:
        return DENSITIES[name]
    if not name.endswith("pct"):
        return None
    try:
        d = float(name[:-3]) / 100
    except ValueError:
        return None
    return d if 0 < d <= 1 else None


def mode_k(mode: str, size: int) -> int | None:
    """Entries kept per step (k) of a sparse mode at N = ``size``; None for the dense ones."""
    import jax_sparse_sync as jss

    spec = parse_mode(mode)
    if spec["density"] is None:
        return None
    return jss.planning.resolve_k(size=size, density=spec["density"], k=None)


def run_algorithm(mode: str, nranks: int, size: int) -> str | None:
    """The allreduce algorithm a mode runs at P = ``nranks`` (``auto`` resolved, as the
    library resolves it at trace time: by ``cost_model.current_alpha_beta()``)."""
    import jax_sparse_sync as jss

    spec = parse_mode(mode)
    if spec["algorithm"] != "auto":
        return spec["algorithm"]
    return jss.planning.resolve_algorithm("auto", nranks=nranks, size=size, k=mode_k(mode, size))


def make_tx(mode: str, comm=None, algorithm: str | None = None, optimizer: str = "sgd"):
    """The timed step's transformation (``algorithm`` overrides the mode's):
    ``optimizer="sgd"``: ``optax.chain(<sync of mode>, optax.sgd(LR))``;
    ``optimizer="adamw"``: ``examples/train_lm.py``'s, ``chain(<sync>,
    clip_by_global_norm(1), adamw(LR))``, for ``adamdir`` ``chain(adam_direction_sync(<sync>,
    max_grad_norm=1), add_decayed_weights, scale_by_learning_rate(LR))``. ``adamdir`` is
    ``jss.adam_direction_sync(topk_sync, momentum_masking="restart")`` (with ``sgd``:
    followed by the learning rate only)."""
    import optax

    import jax_sparse_sync as jss

    if optimizer not in OPTIMIZERS:
        raise ValueError(f"step_time: --optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
    spec = parse_mode(mode)
    kind = spec["kind"]
    if kind in NO_SYNC:
        sync = optax.identity()
    elif kind == "psum":
        sync = pmean_sync("data")
    elif kind == "psum_jss_dense":
        sync = jss.dense_sync(comm=jss.axis("data"))
    elif kind in ("dense", "dense_bf16"):
        sync = jss.dense_sync(comm=comm, wire_dtype=WIRE_DTYPES.get(kind))
    elif kind in ("topk", "adamdir"):
        sync = jss.topk_sync(density=spec["density"], algorithm=algorithm or spec["algorithm"],
                             comm=comm)
    else:
        sync = jss.oktopk_sync(density=spec["density"], comm=comm)
    if kind == "adamdir":
        if optimizer == "sgd":
            return optax.chain(jss.adam_direction_sync(sync, momentum_masking="restart"),
                               optax.scale_by_learning_rate(LR))
        ads = jss.adam_direction_sync(sync, momentum_masking="restart", max_grad_norm=1.0)
        return optax.chain(ads, optax.add_decayed_weights(WEIGHT_DECAY),
                           optax.scale_by_learning_rate(LR))
    if optimizer == "sgd":
        return optax.chain(sync, optax.sgd(LR))
    return optax.chain(sync, optax.clip_by_global_norm(1.0),
                       optax.adamw(LR, weight_decay=WEIGHT_DECAY))


def pmean_sync(axis_name: str):
    """XLA's own dense gradient average over a mesh axis (``jax.lax.pmean``) as an Optax
    transform: the reference the shard_map transport is compared with."""
    import jax
    import optax

    def update_fn(updates, state, params=None):
        del params
        return jax.lax.pmean(updates, axis_name), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update_fn)


def wire_dtype_index(mode: str) -> int:
    """The cost model's id of a mode's value dtype on the wire (0 float32, 1 bfloat16)."""
    from jax_sparse_sync.base.arguments import wire_dtype_id

    return wire_dtype_id(WIRE_DTYPES.get(mode), "step_time")
