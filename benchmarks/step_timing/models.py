"""step_time.py's models: the mlp, and ``examples/models.py``'s transformer and cnn (the
models the convergence runs train), with synthetic batches and their sizes."""

from __future__ import annotations

import sys
from pathlib import Path

MODELS = ("mlp", "transformer", "cnn")


def _shared_models():
    """``examples/models.py`` (TransformerLM, ResNet), imported by path."""
    examples = str(Path(__file__).resolve().parents[2] / "examples")
    if examples not in sys.path:
        sys.path.insert(0, examples)
    import models

    return models


def build_model(name: str, cfg: dict):
    """``(module, loss_fn(params, batch), make_batch(rng, batch_size))`` of model ``name``
    (``mlp``, ``transformer`` or ``cnn``) at the sizes ``cfg`` (see ``model_config``)."""
    import flax.linen as nn
    import numpy as np
    import optax

    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}")
    if name == "mlp":
        class MLP(nn.Module):
            @nn.compact
            def __call__(self, x):
                for _ in range(cfg["layers"]):
                    x = nn.relu(nn.Dense(cfg["hidden"])(x))
                return nn.Dense(cfg["classes"])(x)
        module = MLP()
    else:
        # examples/models.py's classes: the models the convergence runs train
        shared = _shared_models()
        module = (shared.TransformerLM if name == "transformer" else shared.ResNet)(cfg)
    if name == "transformer":
        def make_batch(rng, b):
            tok = rng.integers(0, cfg["vocab"], (b, cfg["seq"] + 1)).astype(np.int32)
            return tok[:, :-1], tok[:, 1:]
    else:  # inputs of N(0, 1) and class labels
        shape = (cfg["input"],) if name == "mlp" else (cfg["image"], cfg["image"], 3)

        def make_batch(rng, b):
            return (rng.standard_normal((b, *shape), np.float32),
                    rng.integers(0, cfg["classes"], b).astype(np.int32))

    def loss_fn(params, batch):
        x, y = batch
        logits = module.apply({"params": params}, x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    return module, loss_fn, make_batch


def init_params(module, make_batch, seed: int):
    """The same initial parameters on every rank (same key)."""
    import jax
    import numpy as np

    x, _ = make_batch(np.random.default_rng(0), 1)
    return module.init(jax.random.key(seed), x)["params"]


def model_config(args, name: str) -> dict:
    """A model's sizes from the command line (``batch`` is per rank / device); the
    transformer and the cnn are ``examples/models.py``'s ``LM_CONFIG`` and ``CNN_CONFIG``
    at those sizes."""
    if name == "mlp":
        return {"input": args.mlp_input, "hidden": args.mlp_hidden, "layers": args.mlp_layers,
                "classes": 10, "batch": args.mlp_batch}
    if name == "transformer":
        return dict(_shared_models().LM_CONFIG, dim=args.tf_dim, heads=args.tf_heads,
                    layers=args.tf_layers, seq=args.tf_seq, batch=args.tf_batch)
    return dict(_shared_models().CNN_CONFIG, widths=args.cnn_widths, blocks=args.cnn_blocks,
                batch=args.cnn_batch)


def setup(cfg: dict):
    """A worker's model: ``build_model``'s ``(module, loss_fn, make_batch)``, the initial
    parameters of ``cfg["seed"]``, N and the number of leaves."""
    import jax
    from jax.flatten_util import ravel_pytree

    module, loss_fn, make_batch = build_model(cfg["model"], cfg["model_cfg"])
    params0 = init_params(module, make_batch, cfg["seed"])
    return (module, loss_fn, make_batch, params0, int(ravel_pytree(params0)[0].size),
            len(jax.tree_util.tree_leaves(params0)))


def fresh(tree):
    """Copies of the initial parameters: every mode donates (consumes) its own."""
    import jax
    import jax.numpy as jnp

    return jax.tree_util.tree_map(jnp.copy, tree)
