"""``shared_support_sync``'s configuration: every argument checked when the transform is built."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from jax_sparse_sync.base.arguments import check_nan_policy
from jax_sparse_sync.base.transform_arguments import resolve_k
from jax_sparse_sync.model.algorithm import resolve_algorithm
from jax_sparse_sync.transforms.sync_config import SparseSyncConfig

__all__ = ["SharedSupportConfig", "check_kept_option", "check_support_options"]

OP = "shared_support_sync"


def check_kept_option(density, k) -> None:
    """Exactly one of ``density`` (in (0, 1]) and ``k`` (an int >= 1), checked before any
    parameter is seen (``k <= N`` is checked at ``init``)."""
    if density is None and k is None:
        raise ValueError(f"jax_sparse_sync.{OP}: pass `density=` (e.g. 0.01) or `k=`.")
    if density is not None and k is not None:
        raise ValueError(f"jax_sparse_sync.{OP}: pass exactly one of `density` or `k`.")
    if density is not None:
        resolve_k(size=1, density=density, k=None, op=OP)  # the range, before any step
    elif isinstance(k, bool) or not isinstance(k, int):
        raise TypeError(f"jax_sparse_sync.{OP}: `k` must be an int; got {k!r}")
    elif k < 1:
        raise ValueError(f"jax_sparse_sync.{OP}: `k` must be in [1, N] (N: the number of "
                         f"gradient entries); got k={k}")


def check_support_options(refresh_every, random_fraction, seed) -> None:
    """The options of the shared support: ``refresh_every``, ``random_fraction``, ``seed``."""
    if isinstance(refresh_every, bool) or not isinstance(refresh_every, int) \
            or refresh_every < 1:
        raise ValueError(f"jax_sparse_sync.{OP}: `refresh_every` must be an int >= 1 (steps "
                         f"between sparse exchanges that choose the shared support; 1 is "
                         f"topk_sync(selection='exact')); got {refresh_every!r}")
    if isinstance(random_fraction, bool) or not isinstance(random_fraction, (int, float)) \
            or not 0.0 <= random_fraction <= 1.0:
        raise ValueError(f"jax_sparse_sync.{OP}: `random_fraction` must be a number in [0, 1] "
                         f"(the part of the k coordinates each step between refreshes draws at "
                         f"random; 0: none); got {random_fraction!r}")
    if random_fraction and refresh_every == 1:
        raise ValueError(f"jax_sparse_sync.{OP}: `random_fraction` moves the support on the "
                         f"steps between refreshes, and refresh_every=1 has none (every step is "
                         f"topk_sync's); pass refresh_every >= 2, or random_fraction=0")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"jax_sparse_sync.{OP}: `seed` must be an int (the same on every "
                        f"rank); got {seed!r}")


@dataclasses.dataclass(frozen=True)
class SharedSupportConfig:
    """:func:`shared_support_sync`'s options, checked when the transform is built.

    Attributes:
      shared: the shared options (density or k, comm, residual dtype, NaN policy).
      refresh_every: steps between the refresh steps that choose the support.
      random_fraction: the part of the k coordinates a shared step draws at random.
      seed: the draws' seed, the same on every rank.
      algorithm: the refresh steps' sparse allreduce algorithm.
    """

    shared: SparseSyncConfig
    refresh_every: int = 2
    random_fraction: float = 0.0
    seed: int = 0
    algorithm: str = "auto"

    @classmethod
    def build(cls, *, density=None, k=None, refresh_every=2, random_fraction=0.0, seed=0,
              algorithm="auto", comm=None, residual_dtype=jnp.float32,
              nan_policy="raise") -> "SharedSupportConfig":
        """The checked configuration; raises what a wrong argument deserves, naming it."""
        check_nan_policy(nan_policy, OP)
        check_kept_option(density, k)
        check_support_options(refresh_every, random_fraction, seed)
        shared = SparseSyncConfig.build(OP, density=density, k=k, comm=comm,
                                        residual_dtype=residual_dtype, nan_policy=nan_policy)
        if algorithm != "auto":
            resolve_algorithm(algorithm, nranks=1, size=1, k=1)  # the name, now
        return cls(shared, refresh_every, random_fraction, seed, algorithm)

    def kept(self, size: int) -> tuple[int, int]:
        """(k, the support's part of it: the rest is drawn at random each shared step)."""
        kk = self.shared.kept(size)
        return kk, kk - int(round(self.random_fraction * kk))

    @property
    def hinted(self) -> bool:
        """A float32 residual: the refresh step's local top-k from the entries above 0.95
        of the hint (the last refresh's k-th magnitude, ``state.threshold``); the other
        residual dtypes select with ``jss.topk`` and keep the threshold as it is."""
        return self.shared.residual_dtype == jnp.float32
