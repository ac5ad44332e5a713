"""The four models of ASC-WFBP's Table IV, in Flax, for their gradient tensors
and per-layer FLOPs (no weights: shapes come from ``jax.eval_shape``).

* ResNet-152 (torchvision's, v1.5: the stride on the 3x3 conv; 467 tensors,
  60.2M parameters),
* DenseNet-201 (torchvision's; 604 tensors, 20.0M),
* Inception-v4 (Cadene's ``pretrainedmodels``, the one the paper's Table III
  counts: 149 conv + BatchNorm units and a linear head; 449 tensors, 42.7M),
* BERT-Base with its pre-training heads (HuggingFace ``BertForPreTraining``:
  the masked-LM decoder tied to the word embeddings, its own bias, and the
  next-sentence head; 206 tensors, 110.1M).

Tensor counts equal the paper's Table III. Layers are PyTorch's: convolutions
without bias before a BatchNorm (scale and bias: 2 tensors), ``NHWC`` here.

:func:`gradient_layers` records every call of a parameterised leaf module under
``jax.eval_shape`` and returns the gradient tensors in backward order, each with the
cumulative FLOPs of the backward pass when it is ready. Used by
``benchmarks/asc_wfbp_table4.py`` and ``benchmarks/grouping_projection.py``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

#: FLOPs per output element of a normalisation layer's forward pass (mean,
#: variance, normalise, scale, shift): a nominal count; norm layers are under
#: 1 % of each model's FLOPs either way.
NORM_FLOPS_PER_ELEMENT = 10


# --------------------------------------------------------------------------- #
# Building blocks (PyTorch layouts)
# --------------------------------------------------------------------------- #
def _pad(padding):
    if isinstance(padding, int):
        return [(padding, padding), (padding, padding)]
    return [(padding[0], padding[0]), (padding[1], padding[1])]


class ConvBN(nn.Module):
    """conv (no bias) + BatchNorm (+ relu): torchvision's conv/bn pairs and
    Inception-v4's ``BasicConv2d``."""

    features: int
    kernel: tuple
    stride: int = 1
    padding: Any = 0
    relu: bool = True

    @nn.compact
    def __call__(self, x):
        x = nn.Conv(self.features, self.kernel, strides=self.stride,
                    padding=_pad(self.padding), use_bias=False)(x)
        x = nn.BatchNorm(use_running_average=False, momentum=0.9, epsilon=1e-5)(x)
        return nn.relu(x) if self.relu else x


def _max_pool(x, k, s, p=0):
    return nn.max_pool(x, (k, k), (s, s), padding=_pad(p))


def _chain(x, *layers):
    """``x`` through ``layers`` in turn (named in the order given, as a line a layer would)."""
    for layer in layers:
        x = layer(x)
    return x


def _avg_pool(x, k, s, p=0):
    return nn.avg_pool(x, (k, k), (s, s), padding=_pad(p), count_include_pad=False)


# ResNet-152 ------------------------------------------------------------------
class Bottleneck(nn.Module):
    width: int
    stride: int
    downsample: bool

    @nn.compact
    def __call__(self, x):
        h = ConvBN(self.width, (1, 1))(x)
        h = ConvBN(self.width, (3, 3), self.stride, 1)(h)
        h = ConvBN(4 * self.width, (1, 1), relu=False)(h)
        if self.downsample:
            x = ConvBN(4 * self.width, (1, 1), self.stride, relu=False)(x)
        return nn.relu(x + h)


class ResNet152(nn.Module):
    classes: int = 1000
    stages: tuple = (3, 8, 36, 3)

    @nn.compact
    def __call__(self, x):
        x = _max_pool(ConvBN(64, (7, 7), 2, 3)(x), 3, 2, 1)
        for s, blocks in enumerate(self.stages):
            for b in range(blocks):
                x = Bottleneck(64 * 2 ** s, 2 if (s and b == 0) else 1, b == 0)(x)
        return nn.Dense(self.classes)(x.mean(axis=(1, 2)))


# DenseNet-201 ----------------------------------------------------------------
class BNReLUConv(nn.Module):
    """DenseNet's pre-activation unit: BatchNorm, relu, conv (no bias)."""

    features: int
    kernel: tuple
    padding: int = 0

    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.BatchNorm(use_running_average=False, momentum=0.9, epsilon=1e-5)(x))
        return nn.Conv(self.features, self.kernel, padding=_pad(self.padding), use_bias=False)(x)


class DenseNet201(nn.Module):
    classes: int = 1000
    growth: int = 32
    blocks: tuple = (6, 12, 48, 32)
    bn_size: int = 4

    @nn.compact
    def __call__(self, x):
        x = _max_pool(ConvBN(64, (7, 7), 2, 3)(x), 3, 2, 1)
        for i, n in enumerate(self.blocks):
            for _ in range(n):
                h = BNReLUConv(self.bn_size * self.growth, (1, 1))(x)
                h = BNReLUConv(self.growth, (3, 3), 1)(h)
                x = jnp.concatenate([x, h], axis=-1)
            if i + 1 < len(self.blocks):
                x = _avg_pool(BNReLUConv(x.shape[-1] // 2, (1, 1))(x), 2, 2)
        x = nn.relu(nn.BatchNorm(use_running_average=False, momentum=0.9, epsilon=1e-5)(x))
        return nn.Dense(self.classes)(x.mean(axis=(1, 2)))


# Inception-v4 ----------------------------------------------------------------
class Mixed3a(nn.Module):
    @nn.compact
    def __call__(self, x):
        return jnp.concatenate([_max_pool(x, 3, 2), ConvBN(96, (3, 3), 2)(x)], -1)


class Mixed4a(nn.Module):
    @nn.compact
    def __call__(self, x):
        b0 = ConvBN(96, (3, 3))(ConvBN(64, (1, 1))(x))
        b1 = ConvBN(64, (1, 1))(x)
        b1 = ConvBN(64, (1, 7), 1, (0, 3))(b1)
        b1 = ConvBN(64, (7, 1), 1, (3, 0))(b1)
        b1 = ConvBN(96, (3, 3))(b1)
        return jnp.concatenate([b0, b1], -1)


class Mixed5a(nn.Module):
    @nn.compact
    def __call__(self, x):
        return jnp.concatenate([ConvBN(192, (3, 3), 2)(x), _max_pool(x, 3, 2)], -1)


class InceptionA(nn.Module):
    @nn.compact
    def __call__(self, x):
        b0 = ConvBN(96, (1, 1))(x)
        b1 = ConvBN(96, (3, 3), 1, 1)(ConvBN(64, (1, 1))(x))
        b2 = ConvBN(64, (1, 1))(x)
        b2 = ConvBN(96, (3, 3), 1, 1)(ConvBN(96, (3, 3), 1, 1)(b2))
        b3 = ConvBN(96, (1, 1))(_avg_pool(x, 3, 1, 1))
        return jnp.concatenate([b0, b1, b2, b3], -1)


class ReductionA(nn.Module):
    @nn.compact
    def __call__(self, x):
        b0 = ConvBN(384, (3, 3), 2)(x)
        b1 = ConvBN(192, (1, 1))(x)
        b1 = ConvBN(256, (3, 3), 2)(ConvBN(224, (3, 3), 1, 1)(b1))
        return jnp.concatenate([b0, b1, _max_pool(x, 3, 2)], -1)


class InceptionB(nn.Module):
    @nn.compact
    def __call__(self, x):
        b0 = ConvBN(384, (1, 1))(x)
        b1 = ConvBN(192, (1, 1))(x)
        b1 = ConvBN(256, (7, 1), 1, (3, 0))(ConvBN(224, (1, 7), 1, (0, 3))(b1))
        b2 = _chain(x, ConvBN(192, (1, 1)), ConvBN(192, (7, 1), 1, (3, 0)),
                    ConvBN(224, (1, 7), 1, (0, 3)), ConvBN(224, (7, 1), 1, (3, 0)),
                    ConvBN(256, (1, 7), 1, (0, 3)))
        b3 = ConvBN(128, (1, 1))(_avg_pool(x, 3, 1, 1))
        return jnp.concatenate([b0, b1, b2, b3], -1)


class ReductionB(nn.Module):
    @nn.compact
    def __call__(self, x):
        b0 = ConvBN(192, (3, 3), 2)(ConvBN(192, (1, 1))(x))
        b1 = _chain(x, ConvBN(256, (1, 1)), ConvBN(256, (1, 7), 1, (0, 3)),
                    ConvBN(320, (7, 1), 1, (3, 0)), ConvBN(320, (3, 3), 2))
        return jnp.concatenate([b0, b1, _max_pool(x, 3, 2)], -1)


class InceptionC(nn.Module):
    @nn.compact
    def __call__(self, x):
        b0 = ConvBN(256, (1, 1))(x)
        b1 = ConvBN(384, (1, 1))(x)
        b1 = jnp.concatenate([ConvBN(256, (1, 3), 1, (0, 1))(b1),
                              ConvBN(256, (3, 1), 1, (1, 0))(b1)], -1)
        b2 = _chain(x, ConvBN(384, (1, 1)), ConvBN(448, (3, 1), 1, (1, 0)),
                    ConvBN(512, (1, 3), 1, (0, 1)))
        b2 = jnp.concatenate([ConvBN(256, (1, 3), 1, (0, 1))(b2),
                              ConvBN(256, (3, 1), 1, (1, 0))(b2)], -1)
        b3 = ConvBN(256, (1, 1))(_avg_pool(x, 3, 1, 1))
        return jnp.concatenate([b0, b1, b2, b3], -1)


class InceptionV4(nn.Module):
    classes: int = 1000

    @nn.compact
    def __call__(self, x):
        x = ConvBN(32, (3, 3), 2)(x)
        x = ConvBN(32, (3, 3))(x)
        x = ConvBN(64, (3, 3), 1, 1)(x)
        x = Mixed5a()(Mixed4a()(Mixed3a()(x)))
        for _ in range(4):
            x = InceptionA()(x)
        x = ReductionA()(x)
        for _ in range(7):
            x = InceptionB()(x)
        x = ReductionB()(x)
        for _ in range(3):
            x = InceptionC()(x)
        return nn.Dense(self.classes)(x.mean(axis=(1, 2)))


# BERT-Base -------------------------------------------------------------------
class Bias(nn.Module):
    """A bias of its own (the masked-LM decoder's, whose weight is tied)."""

    features: int

    @nn.compact
    def __call__(self, x):
        return x + self.param("bias", nn.initializers.zeros, (self.features,))


class BertLayer(nn.Module):
    hidden: int = 768
    heads: int = 12
    intermediate: int = 3072

    @nn.compact
    def __call__(self, x):
        b, t, d = x.shape
        hd = d // self.heads
        q, k, v = (nn.Dense(d, name=n)(x).reshape(b, t, self.heads, hd)
                   for n in ("query", "key", "value"))
        att = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(hd), axis=-1)
        h = jnp.einsum("bhqk,bkhd->bqhd", att, v).reshape(b, t, d)
        x = nn.LayerNorm(epsilon=1e-12)(x + nn.Dense(d, name="attention_output")(h))
        h = nn.gelu(nn.Dense(self.intermediate, name="intermediate")(x))
        return nn.LayerNorm(epsilon=1e-12)(x + nn.Dense(d, name="output")(h))


class BertForPreTraining(nn.Module):
    vocab: int = 30522
    hidden: int = 768
    layers: int = 12
    max_positions: int = 512
    type_vocab: int = 2

    @nn.compact
    def __call__(self, tokens):
        word = nn.Embed(self.vocab, self.hidden, name="word_embeddings")
        pos = jnp.arange(tokens.shape[1])[None]
        x = (word(tokens) + nn.Embed(self.max_positions, self.hidden, name="position")(pos)
             + nn.Embed(self.type_vocab, self.hidden, name="token_type")(jnp.zeros_like(tokens)))
        x = nn.LayerNorm(epsilon=1e-12, name="embeddings_norm")(x)
        for i in range(self.layers):
            x = BertLayer(self.hidden, name=f"layer_{i}")(x)
        pooled = jnp.tanh(nn.Dense(self.hidden, name="pooler")(x[:, 0]))
        nsp = nn.Dense(2, name="seq_relationship")(pooled)
        h = nn.gelu(nn.Dense(self.hidden, name="mlm_transform")(x))
        h = nn.LayerNorm(epsilon=1e-12, name="mlm_norm")(h)
        mlm = Bias(self.vocab, name="mlm_bias")(word.attend(h))
        return mlm, nsp


#: name -> (module factory, input shape of one sample, dtype, paper's label)
MODELS: dict[str, tuple[Callable[[], nn.Module], tuple, Any, str]] = {
    "resnet152": (ResNet152, (224, 224, 3), jnp.float32, "ResNet-152"),
    "densenet201": (DenseNet201, (224, 224, 3), jnp.float32, "DenseNet-201"),
    "inception_v4": (InceptionV4, (224, 224, 3), jnp.float32, "Inception-v4"),
    "bert_base": (BertForPreTraining, (64,), jnp.int32, "BERT-Base"),
}


# --------------------------------------------------------------------------- #
# Gradient tensors and FLOPs
# --------------------------------------------------------------------------- #
@dataclasses.dataclass(frozen=True)
class GradientLayers:
    """A model's gradient tensors in backward order.

    Attributes:
      names: parameter paths (``"ResNet152/.../kernel"``), backward order.
      entries: entries of each tensor.
      ready_flops: forward FLOPs (one sample) of the parameterised layers whose
        backward has run when the tensor is ready (non-decreasing; the last one
        is ``total_flops`` or less).
      total_flops: forward FLOPs of every parameterised layer (one sample).
    """

    names: tuple[str, ...]
    entries: tuple[int, ...]
    ready_flops: tuple[float, ...]
    total_flops: float

    @property
    def parameters(self) -> int:
        return int(sum(self.entries))


def _leaf_flops(module: nn.Module, method: str, args, out) -> float:
    """Forward FLOPs of one call of a parameterised leaf module (2 per multiply-add)."""
    if isinstance(module, nn.Conv):
        k = math.prod(module.kernel_size)
        cin = args[0].shape[-1] // module.feature_group_count
        return 2.0 * k * cin * math.prod(out.shape[:-1]) * out.shape[-1]
    if isinstance(module, nn.Dense):
        return 2.0 * args[0].shape[-1] * math.prod(out.shape)
    if isinstance(module, nn.DenseGeneral):
        return 2.0 * math.prod(args[0].shape) * math.prod(np.atleast_1d(module.features))
    if isinstance(module, nn.Embed):
        if method == "attend":  # the tied decoder: h @ E^T
            return 2.0 * math.prod(args[0].shape) * module.num_embeddings
        return 0.0  # a gather
    if isinstance(module, (nn.BatchNorm, nn.LayerNorm)):
        return float(NORM_FLOPS_PER_ELEMENT * math.prod(out.shape))
    return 0.0


def _transformer_lm():
    """``examples/models.py``'s TransformerLM (LM_CONFIG), imported by path."""
    import sys
    from pathlib import Path

    examples = str(Path(__file__).resolve().parent.parent / "examples")
    if examples not in sys.path:
        sys.path.insert(0, examples)
    import models

    return models.TransformerLM(models.LM_CONFIG)


#: our byte-level transformer LM (examples/models.py), for the projections
OUR_MODELS = {"transformer_lm": (_transformer_lm, (128,), jnp.int32, "our transformer LM")}


def gradient_layers(name: str) -> GradientLayers:
    """The gradient tensors of model ``name`` (a key of :data:`MODELS`) in
    backward order, with the FLOPs behind each one's ready time.

    ``name`` may also be a key of :data:`OUR_MODELS`. A tensor of module M is ready when
    the reverse walk of the forward calls passes M's first call (a tied weight at its
    earliest use); a leaf call's backward costs in proportion to its forward FLOPs
    (parameter-free work not counted). Ties keep their modules' first calls reversed,
    and within a module their names' reverse order.
    """
    factory, shape, dtype, _ = {**MODELS, **OUR_MODELS}[name]
    model = factory()
    calls: list[tuple[tuple[str, ...], float]] = []  # forward order: (module path, flops)

    def interceptor(next_fun, args, kwargs, context):
        module = context.module
        path = tuple(module.scope.path) if module.scope is not None else ()
        if context.method_name not in ("__call__", "attend"):
            return next_fun(*args, **kwargs)
        out = next_fun(*args, **kwargs)
        flops = _leaf_flops(module, context.method_name, args, out)
        # modules enter in forward order; calls are recorded when they return, so a
        # parent's entry comes after its children's (it is reached last backward)
        calls.append((path, flops))
        return out

    x = jax.ShapeDtypeStruct((1,) + tuple(shape), dtype)
    with nn.intercept_methods(interceptor):
        variables = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), jnp.zeros(x.shape,
                                                                                      x.dtype)))
    params = variables["params"]
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    by_module: dict[tuple[str, ...], list[tuple[str, int]]] = {}
    for path, leaf in flat:
        keys = tuple(str(getattr(p, "key", p)) for p in path)
        by_module.setdefault(keys[:-1], []).append((keys[-1], int(math.prod(leaf.shape))))
    starts = {}
    for i, (path, _) in enumerate(calls):  # the earliest record of each module's subtree
        for d in range(len(path) + 1):
            starts.setdefault(path[:d], i)
    missing = set(by_module) - set(starts)
    if missing:
        raise RuntimeError(f"{name}: parameters of modules never called: {sorted(missing)[:3]}")
    # suffix[i]: FLOPs of the calls from i on, i.e. of the backward pass once it has
    # run call i (the calls are recorded as they return, so a leaf's record is in
    # forward order and a parent's comes after its children's)
    suffix = np.concatenate([np.cumsum([f for _, f in calls][::-1])[::-1], [0.0]])
    names, entries, ready = [], [], []
    for mod in sorted(by_module, key=lambda m: -starts[m]):
        for leaf_name, n in sorted(by_module[mod], reverse=True):
            names.append("/".join(mod + (leaf_name,)))
            entries.append(n)
            ready.append(float(suffix[starts[mod]]))
    return GradientLayers(tuple(names), tuple(entries), tuple(ready), float(suffix[0]))
