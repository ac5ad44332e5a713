"""``chunked_topk_sync``: SparseLoCo's compressor as a sync: chunked Top-k, 2-bit values, error feedback.

Each step every rank accumulates ``acc = residual_decay * residual + update``
(:mod:`~jax_sparse_sync.transforms.phases`), keeps the k largest magnitudes of
every chunk of ``chunk`` consecutive entries (``jss.bucket_topk``), sends them
as offsets within their chunk and quantized values with a scale per chunk
(:mod:`~jax_sparse_sync.transforms.chunked_topk_codec` states the format and
the quantizer), and keeps in its residual ``acc`` minus what it sent, the
dequantized values, so that the quantization error is fed back too. The
payloads are fixed-size, so the exchange is one allgather of bytes
(:func:`~jax_sparse_sync.ops.allgather_bytes.allgather_bytes`: ``MPI_Allgather``,
or ``all_gather`` on a mesh axis); every rank decodes the P payloads and adds
them in rank order, so the update, the sum divided by P, is the same bits on
every rank.

SparseLoCo (Sarfi et al., arXiv 2508.15706) applies this compressor to the
pseudo-gradient of a DiLoCo outer step, with error feedback (``residual_decay``
its beta) in place of the outer momentum; as an Optax sync it also compresses
gradients every step.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from jax_sparse_sync.bindings.selection import bucket_topk
from jax_sparse_sync.ops import transport
from jax_sparse_sync.ops.allgather_bytes import allgather_bytes
from jax_sparse_sync.stats import STATS_FIELDS, stats_dtype
from jax_sparse_sync.transforms.accumulator_source import gradient_source
from jax_sparse_sync.transforms.chunked_topk_codec import decode, decode_sum, encode
from jax_sparse_sync.transforms.chunked_topk_config import ChunkedTopkConfig
from jax_sparse_sync.transforms.flat import split_like
from jax_sparse_sync.transforms.phases import accumulate, begin_step, init_size
from jax_sparse_sync.transforms.world import check_world, world_marker

__all__ = ["ChunkedTopkSyncState", "chunked_topk_sync"]

OP = "chunked_topk_sync"
_NNZ = STATS_FIELDS.index("result_nnz")


class ChunkedTopkSyncState(NamedTuple):
    """State of :func:`chunked_topk_sync`: arrays only, so it checkpoints with the optimizer.

    Attributes:
      count: number of steps taken (int32).
      residual: what this rank has accumulated but not sent: one flat float32
        vector of all N entries (the leaves raveled and concatenated in
        ``jax.tree_util`` order; ``jss.unflatten_residual`` gives it their
        shapes); at a sent entry, the accumulator minus its dequantized value.
        It differs from rank to rank: checkpoint it per rank.
      last_stats: this rank's wire statistics of the last step
        (``jss.SyncStats.from_vector`` reads it).
      world: on MPI the one-hot of this rank among P (a step on another
        world size raises, naming ``jss.reshard_state``); ``None`` on a mesh axis.
    """

    count: jax.Array
    residual: jax.Array
    last_stats: jax.Array
    world: jax.Array | None = None


def chunked_topk_sync(
    *,
    chunk: int = 4096,
    k_per_chunk: int | None = None,
    density: float | None = None,
    value_bits: int | None = None,
    value_dtype=None,
    residual_decay=1.0,
    comm=None,
    nan_policy: str = "raise",
) -> optax.GradientTransformation:
    """Error-feedback chunked Top-k with quantized values (SparseLoCo's compressor).

    Each step, on every rank: ``acc = residual_decay * residual + update`` (all
    leaves flattened and concatenated in ``jax.tree_util`` order); ``acc`` cut
    into chunks of ``chunk`` entries (the last may be shorter) and the
    ``k_per_chunk`` largest magnitudes of each kept (ties to the lower index);
    each kept nonzero entry sent as its offset within the chunk (uint16 while
    ``chunk <= 65535``) and its value: with ``value_bits`` b, a sign bit and b - 1
    bits of magnitude level, the level nearest ``|v| L / s`` among ``1..L``
    (``L = 2^(b-1)``, ``s`` the chunk's largest kept magnitude, sent as one
    float32 per chunk), decoded as ``+-level * s / L`` (2 bits: ``+-s/2``,
    ``+-s``); with ``value_dtype``, the value itself in bfloat16 or float32.
    The payloads, of the same size on every rank, are allgathered; every rank
    decodes them and adds them in rank order. The update is that sum divided
    by P, cut into the update's tree and dtypes, the same bits on every rank.
    The new residual is ``acc`` minus the decoded values at the kept entries
    (the quantization error stays), so over the steps what was sent plus the
    residual adds up to what came in.

    On the wire (``SyncStats``, exactly): the 56-byte header check and the
    payload to each of the P - 1 others: ``C k`` offsets (2 bytes each, 4
    past chunks of 65535) + ``ceil(C k b / 8)`` code bytes + ``4 C`` scale
    bytes, for ``C = ceil(N / chunk)`` chunks (``C k`` value bytes of
    ``value_dtype`` instead of codes and scales);
    ``jss.planning.cost_model.chunked_topk_volume`` gives the same count. At
    ``chunk=4096, k_per_chunk=64, value_bits=2`` that is 148 bytes per 4096
    entries, 1/111 of float32's 16384.

    Args:
      chunk: entries per chunk (an int >= 1; 4096 as SparseLoCo).
      k_per_chunk: entries kept per chunk, in [1, chunk]. Exclusive with ``density``.
      density: fraction kept per chunk, in (0, 1]: ``k_per_chunk = round(density
        * chunk)``, at least 1.
      value_bits: 2, 4 or 8: quantized values (2 when neither this nor
        ``value_dtype`` is given).
      value_dtype: ``jnp.bfloat16`` or ``jnp.float32``: unquantized values
        instead (exclusive with ``value_bits``).
      residual_decay: the residual's factor before each step's update is added
        (SparseLoCo's error-feedback beta), a float in (0, 1] or a schedule
        ``count -> factor``; 1.0: plain error feedback.
      comm: mpi4py communicator (``None``: the library's clone of
        COMM_WORLD), or ``jss.axis(name)`` inside ``shard_map``.
      nan_policy: ``"raise"``: a NaN/Inf among any rank's kept values makes
        every rank raise (chunked top-k always keeps them); ``"propagate"``:
        it decodes as NaN/Inf for its whole chunk.

    Returns:
      An ``optax.GradientTransformation`` whose state is a
      :class:`ChunkedTopkSyncState`.

    Raises:
      ValueError: a bad ``chunk``, ``k_per_chunk``, ``density``, ``value_bits``
        or ``value_dtype`` (at construction); TypeError: a non-float leaf.

    Example:
      >>> import jax.numpy as jnp, jax_sparse_sync as jss
      >>> tx = jss.chunked_topk_sync(chunk=4, k_per_chunk=1, value_dtype=jnp.float32)
      >>> state = tx.init({"w": jnp.zeros(6)})
      >>> u, state = tx.update({"w": jnp.array([1., -5., 2., 0., 3., .5])}, state)
      >>> u["w"].tolist(), state.residual.tolist()
      ([0.0, -5.0, 0.0, 0.0, 3.0, 0.0], [1.0, 0.0, 2.0, 0.0, 0.0, 0.5])
    """
    config = ChunkedTopkConfig.build(
        chunk=chunk, k_per_chunk=k_per_chunk, density=density, value_bits=value_bits,
        value_dtype=value_dtype, residual_decay=residual_decay, comm=comm,
        nan_policy=nan_policy)
    return optax.GradientTransformation(functools.partial(init_state, config),
                                        functools.partial(update, config))


def init_state(config: ChunkedTopkConfig, params) -> ChunkedTopkSyncState:
    """The state before the first step: nothing held back, no traffic."""
    size = init_size(config.shared, params, kept=lambda size, density=None: size)
    if not config.shared.on_mesh_axis:
        check_same_format(config, size)
    return ChunkedTopkSyncState(
        count=jnp.zeros((), jnp.int32),
        residual=jnp.zeros((size,), jnp.float32),
        last_stats=jnp.zeros((len(STATS_FIELDS),), stats_dtype()),
        world=world_marker(config.shared.comm))


def check_same_format(config: ChunkedTopkConfig, size: int) -> None:
    """Every MPI rank must build the same payload: a rank with another ``chunk``,
    ``k_per_chunk``, value format or model would decode its peers' bytes wrongly."""
    mine = (size, config.chunk, config.k_per_chunk, config.value_bits, str(config.value_dtype))
    every = config.shared.comm.allgather(mine)
    for rank, theirs in enumerate(every):
        if theirs != every[0]:
            names = ("N (the parameters' entries)", "chunk", "k_per_chunk", "value_bits",
                     "value_dtype")
            diff = ", ".join(f"{n}: {a} on rank 0, {b} on rank {rank}"
                             for n, a, b in zip(names, every[0], theirs) if a != b)
            raise ValueError(f"jax_sparse_sync.{OP}: the ranks must use the same payload "
                             f"format and parameters; they differ in {diff}. Pass the same "
                             f"arguments on every rank")


def update(config: ChunkedTopkConfig, updates, state: ChunkedTopkSyncState, params=None):
    """One step: begin -> accumulate -> chunked top-k and encode -> allgather, decode
    and sum -> settle."""
    del params
    shared = config.shared
    like, size, residual = begin_step(shared, gradient_source(jnp.float32), updates,
                                      state.residual,
                                      lambda: check_world(state.world, shared.comm, OP))
    lay = config.layout(size)
    acc = accumulate(shared, gradient_source(jnp.float32), residual, updates, state.count).acc
    values, indices = bucket_topk(acc, lay.k, lay.chunk)
    payload, _, _ = encode(values, indices, lay)
    gathered, stats = allgather_bytes(payload, comm=shared.comm,
                                      non_finite=~jnp.isfinite(values).all(),
                                      nan_policy=shared.nan_policy, param=lay.k)
    summed, nonzeros = decode_sum(gathered, lay)
    new_updates = split_like(summed, like,
                             scale=transport.comm_size_in_trace(shared.comm, OP))
    return new_updates, ChunkedTopkSyncState(
        count=optax.safe_increment(state.count), residual=settle(acc, payload, lay),
        last_stats=stats.at[_NNZ].set(nonzeros.astype(stats.dtype)),
        world=state.world)


def settle(acc: jax.Array, payload: jax.Array, lay) -> jax.Array:
    """The residual: ``acc`` minus what this rank sent, its payload decoded as every
    rank decodes it (an empty slot's index N is dropped)."""
    indices, sent = decode(payload, lay)
    return acc.at[indices].add(-sent, mode="drop")
