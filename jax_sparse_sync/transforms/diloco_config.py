"""The options of :func:`~jax_sparse_sync.diloco`, checked when the transform is built,
and the schedule they give: which fragment starts an outer step at a step, and which
one is merged.

Steps are counted from 1: step ``t`` is the ``t``-th call of ``update``. Fragment ``f``
of ``F`` starts its outer step after the steps ``t`` with ``t = s_f (mod every)``,
``s_f = (f + 1) * every // F`` (so with one fragment after steps ``every``, ``2 *
every``, ...; with ``F`` they take turns ``every / F`` steps apart and the last one
keeps DiLoCo's rhythm), and is merged into the working parameters ``delay`` steps
later (Streaming DiLoCo's tau; 0: at once).
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

__all__ = ["DiLoCoConfig", "OP", "balanced_groups"]

OP = "diloco"
_WHERE = f"jax_sparse_sync.{OP}"


def _check_transformation(value, name: str, example: str):
    if not isinstance(value, optax.GradientTransformation):
        raise TypeError(f"{_WHERE}: `{name}` must be an optax.GradientTransformation, e.g. "
                        f"{name}={example}; got {value!r}")
    return value


def _check_int(value, name: str, low: int, fix: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise ValueError(f"{_WHERE}: `{name}` must be an int >= {low} ({fix}); got {value!r}")
    return int(value)


def balanced_groups(sizes, count: int) -> tuple[tuple[int, ...], ...]:
    """``count`` runs of consecutive leaf indices, none empty, cut where the running
    total of ``sizes`` is nearest to ``i * total / count``: fragments of about equal size
    in tree order (a leaf is never split)."""
    cum = np.cumsum(np.asarray(sizes, dtype=np.int64))
    cuts, start = [], 0
    for i in range(1, count):
        # the cut after leaf b: at least one leaf behind it and one for each group ahead
        candidates = np.arange(start, len(sizes) - (count - i))
        target = i * cum[-1] / count
        b = int(candidates[np.argmin(np.abs(cum[candidates] - target))])
        cuts.append(b + 1)
        start = b + 1
    bounds = [0, *cuts, len(sizes)]
    return tuple(tuple(range(bounds[i], bounds[i + 1])) for i in range(count))


@dataclasses.dataclass(frozen=True)
class DiLoCoConfig:
    """The checked options of :func:`~jax_sparse_sync.diloco`.

    Attributes:
      inner, outer, sync: the three transformations (``outer`` resolved to the
        paper's Nesterov SGD when not given).
      every: inner steps between two outer steps of a fragment (H).
      fragments: the number of fragments (an int), or a per-leaf assignment (a
        tuple of fragment ids in ``jax.tree_util`` order, or a pytree of ids that
        is a prefix of the parameters' tree).
      delay: steps between a fragment's outer step and its merge (tau).
      mix: the weight of the working parameters in the merge (alpha; 0: replaced
        by the shared parameters).
    """

    inner: optax.GradientTransformation
    outer: optax.GradientTransformation
    sync: optax.GradientTransformation
    every: int
    fragments: Any
    delay: int
    mix: float

    @classmethod
    def build(cls, *, inner, outer, every, sync, fragments, delay, mix) -> "DiLoCoConfig":
        """Checks every argument; raises the user's error here, before any parameter."""
        _check_transformation(inner, "inner", "optax.adamw(1e-3)")
        outer = (optax.sgd(0.7, momentum=0.9, nesterov=True) if outer is None
                 else _check_transformation(outer, "outer", "optax.sgd(0.7, momentum=0.9, "
                                                              "nesterov=True)"))
        _check_transformation(sync, "sync", "jss.dense_sync() or jss.topk_sync(density=0.01) "
                                            "(a sync maps each rank's pseudo-gradient to the "
                                            "mean over the ranks)")
        every = _check_int(every, "every", 1, "inner steps between outer steps, e.g. every=100")
        if isinstance(fragments, numbers.Integral) and not isinstance(fragments, bool):
            fragments = _check_int(fragments, "fragments", 1, "the number of fragments")
            if fragments > every:
                raise ValueError(f"{_WHERE}: `fragments` ({fragments}) must be at most `every` "
                                 f"({every}): each step starts at most one fragment's outer "
                                 f"step; lower fragments or raise every")
        elif fragments is None or isinstance(fragments, (bool, str, float)):
            raise TypeError(f"{_WHERE}: `fragments` must be an int (that many fragments of "
                            f"consecutive leaves) or a fragment id per leaf; got {fragments!r}")
        delay = _check_int(delay, "delay", 0, "steps between a fragment's outer step and its "
                                              "merge, 0: at once")
        if delay >= every:
            raise ValueError(f"{_WHERE}: `delay` ({delay}) must be less than `every` ({every}): "
                             f"a fragment is merged before its next outer step")
        if not (isinstance(mix, numbers.Real) and not isinstance(mix, bool) and 0.0 <= mix <= 1.0):
            raise ValueError(f"{_WHERE}: `mix` must be a float in [0, 1] (the working "
                             f"parameters' weight in a merge; 0: replaced by the shared ones); "
                             f"got {mix!r}")
        return cls(inner, outer, sync, every, fragments, delay, float(mix))

    def groups(self, params) -> tuple[tuple[int, ...], ...]:
        """The fragments' leaf indices (``jax.tree_util`` order), checked against ``params``."""
        leaves = jax.tree_util.tree_leaves(params)
        if not leaves:
            raise ValueError(f"{_WHERE}: the parameters have no leaves")
        if isinstance(self.fragments, int):
            if self.fragments > len(leaves):
                raise ValueError(f"{_WHERE}: `fragments` ({self.fragments}) is more than the "
                                 f"parameters' {len(leaves)} leaves: a leaf is never split; "
                                 f"use at most {len(leaves)} fragments")
            return balanced_groups([np.size(x) for x in leaves], self.fragments)
        ids = self._assignment(params, len(leaves))
        count = max(ids) + 1
        empty = sorted(set(range(count)) - set(ids))
        if empty or min(ids) < 0:
            raise ValueError(f"{_WHERE}: the `fragments` ids must be 0 .. F-1, each used by at "
                             f"least one leaf; got {sorted(set(ids))}")
        if count > self.every:
            raise ValueError(f"{_WHERE}: {count} fragments but `every` is {self.every}: use at "
                             f"most `every` fragments")
        return tuple(tuple(i for i, f in enumerate(ids) if f == g) for g in range(count))

    def _assignment(self, params, count: int) -> list[int]:
        fix = (f"give one int per leaf ({count} in jax.tree_util order) or a tree of ints "
               f"shaped like (a prefix of) the parameters")
        given = self.fragments
        flat = isinstance(given, (list, tuple)) and all(isinstance(f, numbers.Integral)
                                                        for f in given)
        if flat and len(given) == count:
            return [int(f) for f in given]  # one id per leaf, in tree order
        try:  # a tree of ids over (a prefix of) the parameters' tree
            per_leaf = jax.tree_util.tree_map(
                lambda f, sub: [f] * len(jax.tree_util.tree_leaves(sub)), given, params)
        except ValueError as e:
            got = f"{len(given)} ids for {count} leaves" if flat else str(e).splitlines()[0]
            raise ValueError(f"{_WHERE}: the `fragments` assignment does not cover the "
                             f"parameters: {got}; {fix}") from None
        ids = [f for run in jax.tree_util.tree_leaves(
            per_leaf, is_leaf=lambda x: isinstance(x, list)) for f in run]
        if len(ids) != count or not all(isinstance(f, numbers.Integral) for f in ids):
            raise ValueError(f"{_WHERE}: the `fragments` assignment does not cover the "
                             f"parameters: {len(ids)} ids for {count} leaves; {fix}")
        return [int(f) for f in ids]

    def inner_only(self, count: int) -> bool:
        """Whether the step from a state of count ``count`` (a Python int) runs neither
        an outer step nor a merge (the schedule of the module's docstring)."""
        fragments = (self.fragments if isinstance(self.fragments, int)
                     else max(jax.tree_util.tree_leaves(self.fragments)) + 1)
        table = self._table_host(fragments)
        t = int(count) + 1
        merged = t - self.delay >= 1 and table[(t - self.delay) % self.every] < fragments
        return not (table[t % self.every] < fragments or merged)

    def _table_host(self, count: int) -> np.ndarray:
        table = np.full(self.every, count, np.int32)
        for f in range(count):
            table[((f + 1) * self.every // count) % self.every] = f
        return table

    def _table(self, count: int) -> jax.Array:
        """``t mod every`` -> the fragment that starts its outer step (``count``: none)."""
        return jnp.asarray(self._table_host(count))

    def starting(self, t, count: int):
        """The fragment whose outer step runs after step ``t`` (traced), ``count`` if none."""
        return self._table(count)[t % self.every]

    def merging(self, t, count: int):
        """The fragment merged into the working parameters after step ``t``, ``count`` if none."""
        if not self.delay:
            return self.starting(t, count)
        started = t - self.delay
        return jnp.where(started >= 1, self._table(count)[started % self.every], count)
