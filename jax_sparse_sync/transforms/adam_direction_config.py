"""``adam_direction_sync``'s configuration: every argument checked when the transform is built."""

from __future__ import annotations

import dataclasses
from typing import Any

from jax_sparse_sync.bindings.adam import MASKING_IDS, MAX_AGE
from jax_sparse_sync.transforms.adam_pass import MAX_RESTART_B1

__all__ = ["AdamDirectionConfig", "MOMENTUM_MASKINGS", "SECOND_MOMENTS"]

#: ``momentum_masking`` choices: restart the coordinate's first moment and its
#: bias correction; zero the first moment only; leave it (plain scale_by_adam).
MOMENTUM_MASKINGS = tuple(MASKING_IDS)  # the kernel's ids, in order
#: ``second_moment`` choices: this rank's own gradient's; the mean gradient's, estimated.
SECOND_MOMENTS = ("rank", "mean")

OP = "jax_sparse_sync.adam_direction_sync"


def check_adam_constants(b1, b2, momentum_masking) -> None:
    """The momentum masking and Adam's decays (``b1`` bounded by the int16 ages with
    ``"restart"``)."""
    if momentum_masking not in MOMENTUM_MASKINGS:
        raise ValueError(f"{OP}: `momentum_masking` must be one of "
                         f"{MOMENTUM_MASKINGS}, got {momentum_masking!r}")
    for name, value in (("b1", b1), ("b2", b2)):
        if not 0.0 <= value < 1.0:
            raise ValueError(f"{OP}: `{name}` must be in [0, 1), got {value}")
    if momentum_masking == "restart" and b1 >= MAX_RESTART_B1:
        # the ages saturate at 32767 (int16); past it the correction must be 1.0
        raise ValueError(f"{OP}: `b1` = {b1} is too close to 1 "
                         "for momentum_masking='restart': its per-coordinate bias correction "
                         f"1 - b1**age is exact for ages up to {MAX_AGE} only, which needs "
                         f"b1 < {MAX_RESTART_B1:.6f}; pass a smaller b1 or "
                         "momentum_masking='zero' (the global correction 1 - b1**t)")


def check_second_moment(second_moment, nranks, second_moment_warmup) -> None:
    """``second_moment`` and the options that go with ``"mean"``."""
    if second_moment not in SECOND_MOMENTS:
        raise ValueError(f"{OP}: `second_moment` must be one of "
                         f"{SECOND_MOMENTS}, got {second_moment!r}")
    if nranks is not None and (isinstance(nranks, bool) or not isinstance(nranks, int)
                               or nranks < 1):
        raise ValueError(f"{OP}: `nranks` must be None or a "
                         f"positive int (the ranks the sync averages over), got {nranks!r}")
    if isinstance(second_moment_warmup, bool) or not isinstance(second_moment_warmup, int) \
            or second_moment_warmup < 0:
        raise ValueError(f"{OP}: `second_moment_warmup` must be "
                         f"an int >= 0 (steps), got {second_moment_warmup!r}")
    if second_moment_warmup and second_moment != "mean":
        raise ValueError(f"{OP}: `second_moment_warmup` ramps "
                         "in second_moment='mean''s correction; pass second_moment='mean' "
                         "with it")


def check_scaling(max_grad_norm, learning_rate) -> None:
    """The clipping before the pass and the learning rate before the sync."""
    if max_grad_norm is not None and (isinstance(max_grad_norm, bool)
                                      or not isinstance(max_grad_norm, (int, float))
                                      or not max_grad_norm > 0.0):
        raise ValueError(f"{OP}: `max_grad_norm` must be None "
                         "(no clipping) or a positive float (as optax.clip_by_global_norm's "
                         f"max_norm), got {max_grad_norm!r}")
    if learning_rate is not None and not callable(learning_rate):
        try:
            rate = float(learning_rate)
        except TypeError:
            raise TypeError(f"{OP}: `learning_rate` must be None, "
                            f"a float or an optax schedule, got {type(learning_rate).__name__}"
                            ) from None
        if not rate > 0.0:
            raise ValueError(f"{OP}: `learning_rate` must be "
                             f"positive, got {learning_rate}")


@dataclasses.dataclass(frozen=True)
class AdamDirectionConfig:
    """:func:`~jax_sparse_sync.adam_direction_sync`'s options, checked at construction
    (the arguments of the same names; see there)."""

    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    momentum_masking: str = "restart"
    learning_rate: Any = None
    second_moment: str = "rank"
    nranks: int | None = None
    second_moment_warmup: int = 0
    max_grad_norm: float | None = None

    def __post_init__(self):
        # the checks in the order the factory has always made them (eps after the
        # second moment's options)
        check_adam_constants(self.b1, self.b2, self.momentum_masking)
        check_second_moment(self.second_moment, self.nranks, self.second_moment_warmup)
        if not self.eps > 0.0:
            raise ValueError(f"{OP}: `eps` must be positive, got {self.eps}")
        check_scaling(self.max_grad_norm, self.learning_rate)

    @property
    def mean(self) -> bool:
        """``second_moment="mean"``: the state holds the noise estimate's buffers."""
        return self.second_moment == "mean"

    def rate_at(self, count):
        """The learning rate applied before the sync at step ``count`` (0-based), or None."""
        if self.learning_rate is None:
            return None
        return self.learning_rate(count) if callable(self.learning_rate) else self.learning_rate
