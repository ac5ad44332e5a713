"""Where gradient leaves sit in the flat layout (one vector, leaves in tree order).

Shared by the transforms (which lay the leaves out) and the kernel bindings
(which pass the kernels each leaf's first entry and size their scratch).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

__all__ = ["leaf_offsets", "one_range", "placed"]


def leaf_offsets(leaves) -> list[int]:
    """``[0, n0, n0 + n1, ...]``: each leaf's first entry one after the other, and the total."""
    return [0] + np.cumsum([int(np.prod(jnp.shape(x), dtype=np.int64)) for x in leaves]).tolist()


def one_range(starts, leaves) -> bool:
    """Whether leaves placed at ``starts`` follow one another in the flat buffer."""
    return all(s - starts[0] == lo for s, lo in zip(starts, leaf_offsets(leaves)))


def placed(leaves, starts=None) -> tuple[tuple, int]:
    """``(starts, gathered)``: each leaf's first entry (one after the other from 0 when
    ``starts`` is None), and a kernel's scratch length for the part's accumulator
    written in the leaves' order: 1 where they follow one another, else their total."""
    offsets = leaf_offsets(leaves)
    starts = tuple(offsets[:-1]) if starts is None else tuple(starts)
    return starts, 1 if one_range(starts, leaves) else offsets[-1]
