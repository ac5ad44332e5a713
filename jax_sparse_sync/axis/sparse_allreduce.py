"""The JAX-collective transport: the sparse allreduce over a named mesh axis.

``comm=jss.axis("data")`` runs the same algorithms as the MPI transport, but
with JAX's own collectives over the mesh axis ``"data"`` of an enclosing
``jax.shard_map`` (or ``jax.pmap(..., axis_name="data")``): XLA's in-process
collectives on CPU devices, NCCL on GPUs, across hosts with
``jax.distributed``. Each device is a rank. Outside a mapped context the MPI
communicator stays the default. Selection (``jss.topk``) and QSGD are the
same FFI calls as on MPI.

=====================  ==================================================================
algorithm              collectives of one call
=====================  ==================================================================
(every call)           ``all_gather`` of the argument-check header (as many bytes as MPI's)
dense                  ``psum`` of the densified vector
allgather (TopkA)      ``all_gather`` of the (index, value) slots, summed in rank order
recursive_doubling     per round a ``ppermute`` with partner ``rank ^ mask``, preceded (while
                       the streams are sparse) by an ``all_gather`` of their counts; P not a
                       power of two: one ``ppermute`` folds ranks p2..P-1 into 0..P-p2-1
                       first, one more hands them the result
split_allgather        ``all_to_all`` of the per-owner slices; ``all_gather`` of the owners'
                       merged counts; ``all_gather`` of the owners' sparse (or dense) ranges
dsar_split_allgather   ``all_to_all`` as above; ``all_gather`` of the owners' dense ranges
                       (QSGD codes and scales with ``quantize_bits``)
=====================  ==================================================================

Ok-Topk (``jss.oktopk_allreduce`` / ``oktopk_sync``) and the block-sparse
allreduce (``jss.block_allreduce`` / ``block_sync``) run on this transport too,
with the same header check and ladders: see :mod:`jax_sparse_sync.axis_oktopk`
and :mod:`jax_sparse_sync.axis_block`.

Static shapes. XLA needs every exchanged buffer's shape at compile time, but
how many entries travel depends on the data (how much the devices' indices
overlap). Each exchange therefore has a ladder of static capacities, from
the algorithm's bound halving down (``_buckets``), and one ``lax.switch``
branch per capacity; the counts that decide it are known to every device
before the exchange (the header carries each device's nnz and largest
per-owner slice; recursive doubling and phase 2 of split_allgather gather the
counts first, as MPI sends its counts first), so all devices take the same
branch and the smallest capacity that holds everything: nothing is ever
dropped, and at most 2x the entries' bytes travel (padding included in the
counts). The bounds and fallbacks:

* ``allgather``: capacity at most ``cap`` (the input's), so it always fits.
* ``recursive_doubling``: a stream that merged 2^r streams has at most
  ``min(2^r * cap, N)`` entries, the size of the buffer that holds it. When
  the largest stream about to travel passes delta = N/2, every device sends
  dense vectors from then on (4N bytes instead of more than 8 * N/2), as the
  MPI code switches a stream to dense (there per pair, here for all).
* ``split_allgather`` / ``dsar_split_allgather``, phase 1: a slice is at most
  ``cap`` entries, so the largest capacity always fits.
* ``split_allgather``, phase 2: a merged range is at most
  ``min(P * cap, len)``; past ``Lmax // 2`` entries every owner sends its
  range dense (``switched_to_dense = 1``), like MPI's "a range past len/2
  travels dense".

Results are bitwise identical on every device: TopkA sums the gathered slots
in rank order (one scatter per rank, unique indices, so no atomics decide
the order on GPUs); recursive-doubling partners both compute
``merge(lower group, upper group)`` and folded ranks receive a copy; in the
split algorithms only the owner sums its range, in rank order, and everyone
receives its bits. For the same inputs the results equal the MPI transport's
bit for bit, except ``dense`` (XLA's and MPI's reduction orders may differ),
QSGD (the seeds are mixed differently: same error bound, other rounding), and
the sign of zero sums.

Statistics (``return_stats``): the six fields of
:data:`jax_sparse_sync.STATS_FIELDS`, counted from the static shapes actually
exchanged, with the conventions of :mod:`jax_sparse_sync.stats`: a
collective counts as its bandwidth-optimal schedule (an ``all_gather`` of B
bytes sends B to each of P-1 peers, ``psum`` of N floats 2 (P-1)/P * 4N, an
``all_to_all`` of blocks of B bytes sends B to each of P-1 peers in P-1
messages), a ``ppermute`` counts its block once per sending device, and the
argument check (``cost_model.HEADER_BYTES`` to each of P-1 peers) is
included. What differs from the MPI counts: padding up to the chosen
capacity travels and is counted (up to twice the entries' bytes, which can
take the split algorithms' phase 1 past ``cost_model.wire_volume``'s upper
bound; with ``jss.topk`` inputs ``allgather`` still equals it exactly, as does
``dense``); counts travel as 4-byte int32 in an ``all_gather`` to every device
(MPI: 8-byte counts to the partner; the split algorithms need no separate
slice-size exchange, the header carries it); recursive doubling's dense
switch is decided for all devices at once, and dense streams need no counts;
dense ranges are ``Lmax = ceil(N/P)`` floats long.

Under ``shard_map(..., check_vma=True)`` the results of ``dense``,
``allgather`` and the split algorithms are typed invariant over the axis (they
come from ``psum`` / invariant ``all_gather``), so ``out_specs=P()`` accepts
them; recursive doubling ends in ``ppermute``, so JAX types its (identical)
result as varying: use ``check_vma=False`` with it, or ``out_specs=P(axis)``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Hashable

import jax
import jax.numpy as jnp
import numpy as np

from jax_sparse_sync import _ext, cost_model
from jax_sparse_sync.stats import STATS_FIELDS

__all__ = ["AxisComm", "axis", "axis_sparse_allreduce", "AXIS_ALGORITHMS", "resize_residuals"]

#: Algorithms the axis transport implements (``"auto"`` picks among these).
AXIS_ALGORITHMS = ("allgather", "recursive_doubling", "split_allgather", "dsar_split_allgather",
                   "dense")

_SENT = np.int32(2**31 - 1)   # sort key of a padding slot: after every real index
_HEADER_WORDS = max(8, cost_model.HEADER_BYTES // 4)  # int32 words: as many bytes as MPI's
_HB = 4 * _HEADER_WORDS  # header bytes sent to each peer
_F_BAD_INDEX, _F_NONFINITE, _F_BAD_BOUNDARIES = 1, 2, 4


@dataclasses.dataclass(frozen=True)
class AxisComm:
    """A named mesh axis used as a communicator (see :func:`axis`).

    Hashable and immutable, so it can be closed over by jitted functions.
    ``P`` is only known inside a trace that binds the axis (``shard_map`` /
    ``pmap``): :meth:`size` reads it there.
    """

    name: Hashable

    def size(self, op: str = "sparse_allreduce") -> int:
        """Number of devices P along the axis; only inside shard_map/pmap over it."""
        try:
            return int(jax.lax.axis_size(self.name))
        except NameError:
            raise NameError(
                f"jax_sparse_sync.{op}: `comm` is {self!r}, but no mesh axis named "
                f"{self.name!r} is bound here. Call it inside jax.shard_map(..., mesh=mesh) over "
                f"a mesh with that axis (or jax.pmap(..., axis_name={self.name!r})); outside a "
                "mapped context use comm=None (MPI)."
            ) from None

    def rank(self) -> jax.Array:
        """This device's index along the axis (traced)."""
        return jax.lax.axis_index(self.name)

    def __getattr__(self, attr: str):
        # mpi4py methods (Get_size, Dup, py2f, ...) reach here: code written for MPI
        # communicators (non-blocking calls, calibrate) says why it cannot take a mesh axis.
        if attr[:1].isupper() or attr == "py2f":
            raise AttributeError(
                f"jax_sparse_sync: {self!r} is a JAX mesh axis, not an mpi4py communicator, so "
                f"it has no `{attr}`. Non-blocking calls (sparse_allreduce_start/done) and "
                "calibrate() need an MPI communicator; under shard_map/pmap use "
                "jss.sparse_allreduce / oktopk_allreduce / block_allreduce and topk_sync / "
                "oktopk_sync / block_sync / dense_sync (XLA schedules and overlaps collectives "
                "itself).")
        raise AttributeError(attr)

    def __repr__(self) -> str:
        return f"jss.axis({self.name!r})"


def axis(name) -> AxisComm:
    """The mesh axis ``name`` as a communicator: ``comm=jss.axis("data")``.

    Use it inside ``jax.shard_map`` (or ``jax.pmap(..., axis_name=name)``);
    :func:`sparse_allreduce`, :func:`oktopk_allreduce`, :func:`block_allreduce`,
    :func:`topk_sync`, :func:`oktopk_sync`, :func:`block_sync` and
    :func:`dense_sync` then run their algorithms with JAX collectives over
    that axis (see :mod:`jax_sparse_sync.axis` for how each maps to collectives).

    Args:
      name: a mesh axis name (str), or a tuple of them for several axes at
        once (devices are numbered in mesh order).

    Example:
      >>> import jax_sparse_sync as jss
      >>> jss.axis("data")
      jss.axis('data')
    """
    ok = isinstance(name, str) and name or (
        isinstance(name, tuple) and name and all(isinstance(n, str) and n for n in name))
    if not ok:
        raise TypeError(f"jax_sparse_sync.axis: `name` must be a mesh axis name (a non-empty str) "
                        f"or a tuple of them; got {name!r}")
    return AxisComm(name)


# --------------------------------------------------------------------------- #
# small helpers
# --------------------------------------------------------------------------- #
def _log2_ceil(p: int) -> int:
    return (p - 1).bit_length() if p > 1 else 0


def _vary(x, name):
    """``x`` typed as varying over the axis (a no-op without check_vma)."""
    try:
        return jax.lax.pcast(x, name, to="varying")
    except ValueError:  # already varying
        return x


def _f2i(v):
    return jax.lax.bitcast_convert_type(v.astype(jnp.float32), jnp.int32)


def _i2f(i):
    return jax.lax.bitcast_convert_type(i, jnp.float32)


def _dedup_sorted(keys, vals):
    """Sorted keys (padding ``_SENT`` last, equal keys adjacent) -> unique sorted
    keys packed at the front, values of equal keys summed in input order (the
    first is taken as is: ``a``, ``a + b``, ``(a + b) + c``, as the C++ streams do)."""
    n = keys.shape[0]
    real = keys != _SENT
    prev_same = jnp.concatenate([jnp.zeros((1,), bool), keys[1:] == keys[:-1]])
    first = real & ~prev_same
    seg = jnp.cumsum(first.astype(jnp.int32)) - 1
    at_first = jnp.where(first, seg, n)
    out_k = jnp.full((n,), _SENT, jnp.int32).at[at_first].set(keys, mode="drop",
                                                               unique_indices=True)
    out_v = jnp.zeros((n,), jnp.float32).at[at_first].set(vals, mode="drop", unique_indices=True)
    dup = real & prev_same
    out_v = out_v.at[jnp.where(dup, seg, n)].add(vals, mode="drop")
    return out_k, out_v


def _sort(keys, vals):
    return jax.lax.sort((keys, vals), num_keys=1, is_stable=True)


def _merge(lower, upper):
    """Sorted unique streams -> their sum as one sorted unique stream (lower + upper).

    A merge by rank, not a sort: an entry's place is its index plus the number
    of the other stream's entries before it; an index present in both lands
    lower first, upper right after, and is summed ``lower + upper``.
    """
    (ak, av), (bk, bv) = lower, upper
    at_a = jnp.arange(ak.shape[0], dtype=jnp.int32) + jnp.searchsorted(bk, ak, side="left")
    at_b = jnp.arange(bk.shape[0], dtype=jnp.int32) + jnp.searchsorted(ak, bk, side="right")
    size = ak.shape[0] + bk.shape[0]
    keys = jnp.zeros((size,), jnp.int32).at[at_a].set(ak, unique_indices=True).at[at_b].set(
        bk, unique_indices=True)
    vals = jnp.zeros((size,), jnp.float32).at[at_a].set(av, unique_indices=True).at[at_b].set(
        bv, unique_indices=True)
    return _dedup_sorted(keys, vals)


def _canonical(keys, vals):
    """COO with padding ``_SENT`` -> sorted unique stream; skips the sort when the
    input is one already (``jss.topk``'s output is)."""
    ordered = jnp.all((keys[1:] > keys[:-1]) | (keys[1:] == _SENT))
    return jax.lax.cond(ordered, lambda: (keys, vals), lambda: _dedup_sorted(*_sort(keys, vals)))


def _densify(keys, vals, n):
    return jnp.zeros((n,), jnp.float32).at[jnp.where(keys == _SENT, n, keys)].set(
        vals, mode="drop", unique_indices=True)


def _stats_dtype():
    return jnp.int64 if jax.config.jax_enable_x64 else jnp.int32


class _Counters:
    """bytes_sent / bytes_received / messages of this device, saturating like the C++ ones."""

    def __init__(self):
        self.dt = _stats_dtype()
        self.lim = int(np.iinfo(self.dt).max)
        self.sent = self.received = self.messages = jnp.zeros((), self.dt)

    def value(self, amount):
        if isinstance(amount, (int, np.integer)):
            return jnp.asarray(min(int(amount), self.lim), self.dt)
        return jnp.asarray(amount).astype(self.dt)

    def table(self, amounts, index):
        """One of several static amounts, picked by a traced index."""
        return jnp.asarray([min(int(a), self.lim) for a in amounts], self.dt)[index]

    def _add(self, cur, amount, when):
        a = jnp.where(when, self.value(amount), 0).astype(self.dt)
        return jnp.where(cur > self.lim - a, self.lim, cur + a).astype(self.dt)

    def add(self, sent=0, received=0, messages=0, *, send=True, recv=True):
        self.sent = self._add(self.sent, sent, send)
        self.received = self._add(self.received, received, recv)
        self.messages = self._add(self.messages, messages, send)

    def collective(self, nbytes: int, messages: int):
        """A collective where every device sends and receives ``nbytes``."""
        self.add(nbytes, nbytes, messages)


def _buckets(hi: int, lo: int) -> list[int]:
    """Static capacities hi, ceil(hi/2), ceil(hi/4), ... down to the first <= lo; ascending."""
    out = [max(1, hi)]
    while out[-1] > max(1, lo):
        out.append(-(-out[-1] // 2))
    return sorted(set(out))


def _bucket_index(need, buckets: list[int]):
    """Index of the smallest bucket >= need (need <= buckets[-1]); uniform if need is."""
    if len(buckets) == 1:
        return jnp.int32(0)
    return jnp.sum(jnp.asarray(buckets[:-1], jnp.int32) < need).astype(jnp.int32)


def _uniform_max(x, name):
    """max over the axis of an int32 scalar, typed invariant (an all_gather, as MPI's counts)."""
    return jax.lax.all_gather(_vary(jnp.asarray(x, jnp.int32), name), name, to="invarying").max()


# --------------------------------------------------------------------------- #
# argument check (header exchange)
# --------------------------------------------------------------------------- #
def _header_error(h: np.ndarray, size: int, op: str) -> str | None:
    """The MPI transport's messages, from the gathered headers (numpy, on the host)."""
    h = np.asarray(h).astype(np.int64)
    first = h[0]
    for r in range(h.shape[0]):
        if h[r, 3] != first[3]:
            return (f"jax_sparse_sync.{op}: `size` differs across ranks: rank 0 passed "
                    f"size={first[3]} but rank {r} passed size={h[r, 3]}. Every rank must pass "
                    "the same dense size (the same model, flattened the same way).")
        if h[r, 4] != first[4]:
            names = {v: k for k, v in _ext.ALGORITHM_IDS.items()}

            def describe(word):
                d = names.get(int(word) & 0xFFFF, str(int(word) & 0xFFFF))
                return d + (f" (quantize_bits={int(word) >> 16})" if int(word) >> 16 else "")
            return (f"jax_sparse_sync.{op}: `algorithm` differs across ranks (rank 0 uses "
                    f"'{describe(first[4])}', rank {r} uses '{describe(h[r, 4])}'). Pass the "
                    "same algorithm on every rank; algorithm='auto' decides from values that "
                    "are equal on all ranks.")
        if h[r, 5] != first[5]:
            return (f"jax_sparse_sync.{op}: the capacity of `values` differs across ranks: rank 0 "
                    f"passed {first[5]} slots but rank {r} passed {h[r, 5]}. Every process must "
                    "trace the same step (the same shapes).")
        if h[r, 8] != first[8]:
            pname = "block_size" if (int(first[4]) & 0xFFFF) == _ext.ALGORITHM_IDS["block"] else "k"
            return (f"jax_sparse_sync.{op}: `{pname}` differs across ranks: rank 0 passed "
                    f"{pname}={first[8]} but rank {r} passed {pname}={h[r, 8]}. Pass the same "
                    "value on every rank.")
        if h[r, 0] & _F_BAD_INDEX:
            return (f"jax_sparse_sync.{op}: `indices` out of range on rank {r}: "
                    f"indices[{h[r, 1]}] = {h[r, 2]} is not in [0, size={size}). Use index -1 "
                    "for padding slots (value 0).")
    bad = [r for r in range(h.shape[0]) if h[r, 0] & _F_NONFINITE]
    if bad:
        return (f"jax_sparse_sync.{op}: non-finite (NaN or Inf) entries in `values` on rank(s) "
                f"{', '.join(map(str, bad))}. The gradient diverged or the loss produced NaN; "
                "fix the model, lower the learning rate, or pass nan_policy='propagate' to let "
                "non-finite values reach the sum as a dense allreduce would.")
    if any(h[r, 0] & _F_BAD_BOUNDARIES for r in range(h.shape[0])):
        return (f"jax_sparse_sync.{op}: `boundaries` must start at 0, end at `size` and never "
                "decrease (pass recompute_boundaries=True to compute them)")
    return None


def _raise_on_error(h, *, size, op):
    msg = _header_error(h, size, op)
    if msg is not None:
        raise ValueError(msg)


def exchange_slices(keys, vals, starts, width: int, name):
    """all_to_all of sorted COO slices: owner q gets ``keys[starts[q]:starts[q+1]]``
    and their values (as int32 bits), at most ``width`` of them, padded with
    (-1, 0). Returns what every sender sent here, ``[P senders, 2, width]``."""
    cap = keys.shape[0]
    pos = starts[:-1, None] + jnp.arange(width, dtype=jnp.int32)[None, :]
    ok = pos < starts[1:, None]
    safe = jnp.clip(pos, 0, cap - 1)
    send = jnp.stack([jnp.where(ok, keys[safe], -1), jnp.where(ok, _f2i(vals[safe]), 0)],
                     axis=1)  # [P owners, 2, width]
    return jax.lax.all_to_all(send, name, 0, 0)


def one_slot_if_empty(values, indices):
    """An empty contribution as one padding slot (value 0, index -1): the
    exchanges then need no special path for it."""
    if values.shape[0] == 0:
        return jnp.zeros((1,), jnp.float32), jnp.full((1,), -1, jnp.int32)
    return values, indices


def local_checks(values, indices, n: int, nan_policy: str):
    """A device's checks of its contribution before any exchange, as the MPI
    handlers make them: an index outside ``[-1, n)``, and under
    ``nan_policy="raise"`` a non-finite value in a valid slot. Returns
    ``(valid, first_bad, flags)``: which slots hold an entry, the position of
    the first bad index, and the header flags (_F_BAD_INDEX | _F_NONFINITE)."""
    from jax_sparse_sync.sparse_allreduce import NAN_POLICIES
    bad = (indices < -1) | (indices >= n)
    valid = (indices >= 0) & ~bad
    first_bad = jnp.argmax(bad).astype(jnp.int32)
    nonfinite = (valid & ~jnp.isfinite(values)).any() if NAN_POLICIES[nan_policy] == 0 \
        else jnp.asarray(False)
    flags = jnp.where(bad.any(), _F_BAD_INDEX, 0) | jnp.where(nonfinite, _F_NONFINITE, 0)
    return valid, first_bad, flags


def checked_headers(name, *, flags, size: int, word: int, op: str, first_bad=0, bad_index=0,
                    cap: int = 0, param: int = 0, slots=(0, 0)):
    """The argument check of every axis-transport call (MPI's header allgather).

    Every device contributes a header (its error flags, the first bad index,
    what must agree: size, algorithm word, capacity, ``param`` (Ok-Topk's k,
    the block size), and two algorithm-specific counts in ``slots``); all
    devices gather all headers, so they all see the same error and raise it
    together through a host callback (nobody is left waiting in a collective).

    Returns ``(headers [P, _HEADER_WORDS] int32, zero)``: add ``zero`` (an int32
    0 that depends on the check) to the data so the collectives run after it.
    """
    header = jnp.zeros((_HEADER_WORDS,), jnp.int32).at[:9].set(jnp.stack([
        jnp.asarray(flags, jnp.int32), jnp.asarray(first_bad, jnp.int32),
        jnp.asarray(bad_index, jnp.int32), jnp.int32(size), jnp.int32(word), jnp.int32(cap),
        jnp.asarray(slots[0], jnp.int32), jnp.asarray(slots[1], jnp.int32), jnp.int32(param)]))
    headers = jax.lax.all_gather(_vary(header, name), name, to="invarying")  # [P, _HEADER_WORDS]
    error = ((headers[:, 0] != 0) | (headers[:, 3] != headers[0, 3])
             | (headers[:, 4] != headers[0, 4]) | (headers[:, 5] != headers[0, 5])
             | (headers[:, 8] != headers[0, 8])).any()

    def fail():
        jax.debug.callback(_raise_on_error, headers, size=size, op=op)
        return jnp.int32(0)

    # Every device sees the same headers, so all raise together (nobody waits in a
    # collective); the data collectives depend on the check, so they come after it.
    return headers, jax.lax.cond(error, fail, lambda: jnp.int32(0))


# --------------------------------------------------------------------------- #
# the algorithms: (keys, vals) is this device's sorted unique stream, packed at
# the front of its capacity (padding key _SENT after the last entry)
# --------------------------------------------------------------------------- #
def _dense(values, indices, n, name, p, ctr):
    dense = jnp.zeros((n,), jnp.float32).at[jnp.where(indices < 0, n, indices)].add(
        values, mode="drop")
    out = jax.lax.psum(dense, name)
    ctr.collective(2 * (p - 1) * n * 4 // p, 2 * _log2_ceil(p))
    return out, 0


def _allgather(keys, vals, n, name, p, max_nnz, ctr):
    cap = keys.shape[0]
    buckets = _buckets(cap, -(-cap // 4))

    def gather(c):
        packed = jnp.stack([jnp.where(keys[:c] == _SENT, -1, keys[:c]), _f2i(vals[:c])])
        rows = jax.lax.all_gather(packed, name, to="invarying")  # [P, 2, c]

        def add_rank(r, out):  # rank order; one rank's indices are unique: no atomics decide
            row = rows[r]
            return out.at[jnp.where(row[0] < 0, n, row[0])].add(_i2f(row[1]), mode="drop",
                                                                 unique_indices=True)

        return jax.lax.fori_loop(0, p, add_rank, jnp.zeros((n,), jnp.float32))

    index = _bucket_index(max_nnz, buckets)
    out = jax.lax.switch(index, [functools.partial(gather, c) for c in buckets])
    ctr.collective(ctr.table([(p - 1) * 8 * c for c in buckets], index), _log2_ceil(p))
    return out, 0


_KEEP, _MERGE, _TAKE = 0, 1, 2


def _recursive_doubling(keys, vals, n, name, p, rank, ctr):
    """SSAR_Recursive_double with JAX collectives; see the module docstring.

    The stages (fold, log2(p2) rounds, hand-back) are unrolled. Before each
    sparse stage the devices learn the largest stream about to travel; if it
    passes delta = N/2, the rest of the algorithm runs dense: the dense tail is
    the other branch of a ``lax.cond``, so the N-float vector only exists on
    the path that needs it.
    """
    delta = n // 2
    p2 = 1 << (p.bit_length() - 1)
    extra = p - p2
    cap = keys.shape[0]
    lg = _log2_ceil(p)
    dt, lim = ctr.dt, ctr.lim

    # (perm, mode, mine_lower, capacity after the stage); mode and mine_lower are traced
    stages, c = [], cap
    if extra:  # fold: ranks p2..P-1 hand their stream to rank - p2
        c = min(2 * c, n)
        stages.append(([(p2 + i, i) for i in range(extra)], jnp.where(rank < extra, _MERGE, _KEEP),
                       jnp.asarray(True), c))
    mask = 1
    while mask < p2:
        c = min(2 * c, n)
        stages.append(([(i, i ^ mask) for i in range(p2)], jnp.where(rank < p2, _MERGE, _KEEP),
                       rank < (rank ^ mask), c))
        mask <<= 1
    if extra:  # the folded ranks get the result back
        stages.append(([(i, p2 + i) for i in range(extra)], jnp.where(rank >= p2, _TAKE, _KEEP),
                       jnp.asarray(True), c))

    def roles(perm):
        senders, receivers = np.zeros(p, bool), np.zeros(p, bool)
        for s_, d_ in perm:
            senders[s_], receivers[d_] = True, True
        return jnp.asarray(senders)[rank], jnp.asarray(receivers)[rank]

    def pick3(mode, own, merged, theirs):
        return jnp.where(mode == _MERGE, merged, jnp.where(mode == _TAKE, theirs, own))

    def fit(a, fill, size):  # pad, or cut (only padding is cut), to `size` slots
        if a.shape[0] >= size:
            return a[:size]
        return jnp.concatenate([a, jnp.full((size - a.shape[0],), fill, a.dtype)])

    def add(total, amount, when):  # saturating, in the stats dtype
        a = jnp.where(when, amount, 0).astype(dt)
        return jnp.where(total > lim - a, lim, total + a).astype(dt)

    def vary(*xs):
        return tuple(_vary(a, name) for a in xs)

    def dense_from(i, x, counters):
        """Stages i.. with dense vectors (4N bytes per message)."""
        sent, recv, msgs = counters
        for perm, mode, mine_lower, _ in stages[i:]:
            sends, gets = roles(perm)
            theirs = jax.lax.ppermute(x, name, perm)
            merged = jnp.where(mine_lower, x + theirs, theirs + x)  # lower + upper
            x = pick3(mode, x, merged, theirs)
            nbytes = jnp.asarray(min(4 * n, lim), dt)
            sent, recv, msgs = add(sent, nbytes, sends), add(recv, nbytes, gets), add(msgs, 1, sends)
        return vary(x, jnp.asarray(True), sent, recv, msgs)

    def sparse_from(i, k, v, counters):
        """Stage i on the sorted unique stream (k, v), then the rest."""
        if i == len(stages):
            # every device holds the same stream now: the same flag everywhere
            return vary(_densify(k, v, n), jnp.sum(k != _SENT) > delta, *counters)
        perm, mode, mine_lower, c_next = stages[i]
        sent, recv, msgs = counters
        sends, gets = roles(perm)
        # Everyone learns the largest stream about to travel (MPI sends a count first).
        need = _uniform_max(jnp.where(sends, jnp.sum(k != _SENT), 0), name)
        cnt = jnp.asarray(min(4 * (p - 1), lim), dt)
        counters = (add(sent, cnt, True), add(recv, cnt, True), add(msgs, lg, True))

        def go_dense():
            return dense_from(i, _densify(k, v, n), counters)

        def stay_sparse():
            c = k.shape[0]
            buckets = _buckets(min(c, delta), -(-cap // 2))

            def send(width):
                got = jax.lax.ppermute(jnp.stack([k[:width], _f2i(v[:width])]), name, perm)
                return vary(fit(got[0], _SENT, c), fit(_i2f(got[1]), 0.0, c))

            index = _bucket_index(need, buckets)
            tk, tv = jax.lax.switch(index, [functools.partial(send, w) for w in buckets])
            tk = jnp.where(gets, tk, _SENT)  # devices that received nothing got zeros
            # f(lower group, upper group): the same on both partners
            lower = (jnp.where(mine_lower, k, tk), jnp.where(mine_lower, v, tv))
            upper = (jnp.where(mine_lower, tk, k), jnp.where(mine_lower, tv, v))
            mk, mv = _merge(lower, upper)
            nk = pick3(mode, fit(k, _SENT, c_next), fit(mk, _SENT, c_next), fit(tk, _SENT, c_next))
            nv = pick3(mode, fit(v, 0.0, c_next), fit(mv, 0.0, c_next), fit(tv, 0.0, c_next))
            nbytes = jnp.asarray([min(8 * w, lim) for w in buckets], dt)[index]
            s, r, m = counters
            return sparse_from(i + 1, nk, nv, (add(s, nbytes, sends), add(r, nbytes, gets),
                                               add(m, 1, sends)))

        return jax.lax.cond(need > delta, go_dense, stay_sparse)

    zero = jnp.zeros((), dt)
    out, switched, sent, recv, msgs = sparse_from(0, keys, vals, (zero, zero, zero))
    ctr.add(sent, recv, msgs)
    return out, switched


def _split_phase1(keys, vals, n, name, p, rank, max_slice, ctr):
    """Owner q receives every rank's entries in [bounds[q], bounds[q+1]) (one all_to_all,
    slices of a capacity that fits the largest slice anywhere) and sums them into its
    dense range in rank order. Returns (acc[lmax], present[lmax], bounds)."""
    cap = keys.shape[0]
    bounds = [n * q // p for q in range(p + 1)]
    lmax = max(bounds[q + 1] - bounds[q] for q in range(p))
    starts = jnp.searchsorted(keys, jnp.asarray(bounds, jnp.int32), side="left").astype(jnp.int32)
    lo = jnp.asarray(bounds, jnp.int32)[rank]
    buckets = _buckets(cap, -(-cap // p))

    def exchange(width):
        got = exchange_slices(keys, vals, starts, width, name)

        def add_sender(s, carry):  # rank order; a sender's indices are unique
            acc, present = carry
            at = jnp.where(got[s, 0] < 0, lmax, got[s, 0] - lo)
            return (acc.at[at].add(_i2f(got[s, 1]), mode="drop", unique_indices=True),
                    present.at[at].set(True, mode="drop", unique_indices=True))

        init = (_vary(jnp.zeros((lmax,), jnp.float32), name),
                _vary(jnp.zeros((lmax,), bool), name))
        return jax.lax.fori_loop(0, p, add_sender, init)

    index = _bucket_index(max_slice, buckets)
    acc, present = jax.lax.switch(index, [functools.partial(exchange, w) for w in buckets])
    ctr.collective(ctr.table([8 * w * (p - 1) for w in buckets], index), p - 1)
    return acc, present, bounds


def _assemble(rows, bounds):
    """[P, lmax] owner ranges -> the dense vector."""
    p = rows.shape[0]
    n = bounds[-1]
    if n % p == 0:
        return rows.reshape(n)
    return jnp.concatenate([rows[q, :bounds[q + 1] - bounds[q]] for q in range(p)])


def _split(keys, vals, n, name, p, rank, max_slice, ctr):
    acc, present, bounds = _split_phase1(keys, vals, n, name, p, rank, max_slice, ctr)
    cap = keys.shape[0]
    lmax = acc.shape[0]
    lo = jnp.asarray(bounds, jnp.int32)[rank]
    lg = _log2_ceil(p)
    # The owners' merged counts (MPI: block descriptors), then every owner's range:
    # sparse, in blocks that fit the largest; dense past lmax/2 (where dense is smaller).
    need = _uniform_max(jnp.sum(present), name)
    ctr.collective(4 * (p - 1), lg)
    hi = min(p * cap, lmax // 2)
    buckets = _buckets(hi, -(-cap // p)) if hi >= 1 else []

    # this owner's merged range, compacted once (entries first, then padding)
    width_max = max(buckets) if buckets else 1
    slot = jnp.where(present, jnp.cumsum(present.astype(jnp.int32)) - 1, width_max)
    mk = jnp.full((width_max,), -1, jnp.int32).at[slot].set(
        jnp.arange(lmax, dtype=jnp.int32) + lo, mode="drop", unique_indices=True)
    mv = jnp.zeros((width_max,), jnp.float32).at[slot].set(acc, mode="drop", unique_indices=True)

    def sparse(width):
        rows = jax.lax.all_gather(jnp.stack([mk[:width], _f2i(mv[:width])]), name,
                                  to="invarying")  # [P, 2, width]
        ks, vs = rows[:, 0].reshape(-1), _i2f(rows[:, 1]).reshape(-1)
        return jnp.zeros((n,), jnp.float32).at[jnp.where(ks < 0, n, ks)].set(
            vs, mode="drop", unique_indices=True)

    def dense_branch():
        return _assemble(jax.lax.all_gather(acc, name, to="invarying"), bounds)

    index = jnp.where(need > hi, len(buckets), _bucket_index(need, buckets)) if buckets \
        else jnp.int32(0)
    out = jax.lax.switch(index, [functools.partial(sparse, w) for w in buckets] + [dense_branch])
    ctr.collective(ctr.table([8 * w * (p - 1) for w in buckets] + [4 * lmax * (p - 1)], index),
                   lg)
    return out, index == len(buckets)


def _dsar(keys, vals, n, name, p, rank, max_slice, ctr, *, quantize_bits, qsgd_bucket, seed):
    acc, _, bounds = _split_phase1(keys, vals, n, name, p, rank, max_slice, ctr)
    lmax = acc.shape[0]
    lg = _log2_ceil(p)
    if not quantize_bits:
        rows = jax.lax.all_gather(acc, name, to="invarying")
        ctr.collective(4 * lmax * (p - 1), lg)
        return _assemble(rows, bounds), 1
    from jax_sparse_sync.compression import qsgd_dequantize, qsgd_quantize
    # Each owner quantizes its range once, with the step's seed mixed with its rank;
    # every device dequantizes the same bytes.
    mixed = (jnp.asarray(seed, jnp.int32).astype(jnp.uint32) * np.uint32(0x9E3779B1)
             + (rank.astype(jnp.uint32) + np.uint32(1)) * np.uint32(0x85EBCA6B))
    packed, scales = qsgd_quantize(acc, bits=quantize_bits, bucket=qsgd_bucket,
                                   seed=jax.lax.bitcast_convert_type(mixed, jnp.int32))
    all_packed = jax.lax.all_gather(packed, name, to="invarying")
    all_scales = jax.lax.all_gather(scales, name, to="invarying")
    rows = jax.vmap(lambda a, b: qsgd_dequantize(a, b, size=lmax, bits=quantize_bits,
                                                 bucket=qsgd_bucket))(all_packed, all_scales)
    ctr.collective((packed.shape[0] + 4 * scales.shape[0]) * (p - 1), 2 * lg)
    return _assemble(rows, bounds), 1


# --------------------------------------------------------------------------- #
# entry point (called by jss.sparse_allreduce for comm=jss.axis(...))
# --------------------------------------------------------------------------- #
def _check_arguments(values, indices, size, nan_policy, op):
    # The same checks and messages as the MPI transport (imported late: the
    # sparse_allreduce module imports this one through comm).
    from jax_sparse_sync.sparse_allreduce import check_coo_arguments
    return check_coo_arguments(values, indices, size, nan_policy, op)


def resolve_axis_algorithm(algorithm: str, *, nranks: int, size: int, k: int) -> str:
    """Checks ``algorithm``; ``"auto"`` -> the cheapest of :data:`AXIS_ALGORITHMS` by the
    cost model (worst case, which is what static shapes send)."""
    from jax_sparse_sync.sparse_allreduce import resolve_algorithm
    if algorithm == "auto":
        return min(AXIS_ALGORITHMS, key=lambda a: cost_model.predict_time(
            a, nranks=nranks, size=size, k=k))
    algorithm = resolve_algorithm(algorithm, nranks=nranks, size=size, k=k)
    if algorithm not in AXIS_ALGORITHMS:
        raise NotImplementedError(
            f"jax_sparse_sync: algorithm {algorithm!r} has no JAX-collective (mesh axis) "
            f"implementation yet; choose one of {AXIS_ALGORITHMS} or 'auto', or use MPI "
            "(comm=None) outside shard_map/pmap.")
    return algorithm


def axis_sparse_allreduce(values, indices, *, size: int, algorithm: str, comm: AxisComm,
                          nan_policy: str = "raise", quantize_bits: int = 0,
                          qsgd_bucket: int = 1024, seed=0, op: str = "sparse_allreduce"):
    """The sparse allreduce over ``comm``'s mesh axis: ``(sum f32[size], stats vector)``.

    Same arguments and semantics as :func:`jax_sparse_sync.sparse_allreduce`
    (which calls this for ``comm=jss.axis(...)``); the stats vector has the
    layout of :data:`jax_sparse_sync.STATS_FIELDS`. Errors found at run time
    (out-of-range indices, NaN with ``nan_policy="raise"``) are detected on
    all devices at once from the gathered headers, and every device raises the
    MPI transport's message (as a ``JaxRuntimeError`` from a host callback),
    so no device is left waiting in a collective.
    """
    from jax_sparse_sync.sparse_allreduce import check_quantization
    values = jnp.asarray(values)
    indices = jnp.asarray(indices)
    size = _check_arguments(values, indices, size, nan_policy, op)
    p = comm.size(op)
    algo = resolve_axis_algorithm(algorithm, nranks=p, size=size, k=values.shape[0])
    check_quantization(quantize_bits, qsgd_bucket, algo, op)
    n, name = size, comm.name

    values, indices = one_slot_if_empty(values.astype(jnp.float32), indices)
    cap = values.shape[0]
    rank = jax.lax.axis_index(name)

    # Local checks; the header carries them (and what must agree) to every device.
    valid, first_bad, flags = local_checks(values, indices, n, nan_policy)

    keys = jnp.where(valid, indices, _SENT)
    vals = jnp.where(valid, values, 0.0)
    nnz = max_slice = jnp.int32(0)
    if algo != "dense":
        keys, vals = _canonical(keys, vals)  # drops padding, sums duplicates, sorts
        nnz = jnp.sum(keys != _SENT).astype(jnp.int32)
        if algo in ("split_allgather", "dsar_split_allgather"):
            bounds = jnp.asarray([n * q // p for q in range(p + 1)], jnp.int32)
            starts = jnp.searchsorted(keys, bounds, side="left")
            max_slice = (starts[1:] - starts[:-1]).max().astype(jnp.int32)
    word = _ext.ALGORITHM_IDS[algo] | (int(quantize_bits) << 16)
    headers, zero = checked_headers(
        name, flags=flags, first_bad=first_bad, bad_index=indices[first_bad], size=n, word=word,
        cap=cap, slots=(max_slice, nnz), op=op)
    ctr = _Counters()
    ctr.collective(_HB * (p - 1), _log2_ceil(p))
    keys, vals = _vary(keys + zero, name), _vary(vals, name)
    if algo == "dense":
        out, switched = _dense(vals, jnp.where(keys == _SENT, -1, keys), n, name, p, ctr)
    elif algo == "allgather":
        out, switched = _allgather(keys, vals, n, name, p, headers[:, 7].max(), ctr)
    elif algo == "recursive_doubling":
        out, switched = _recursive_doubling(keys, vals, n, name, p, rank, ctr)
    elif algo == "split_allgather":
        out, switched = _split(keys, vals, n, name, p, rank, headers[:, 6].max(), ctr)
    else:
        out, switched = _dsar(keys, vals, n, name, p, rank, headers[:, 6].max(), ctr,
                              quantize_bits=int(quantize_bits), qsgd_bucket=int(qsgd_bucket),
                              seed=seed)
    dt = ctr.dt
    stats = jnp.stack([ctr.sent, ctr.received, ctr.messages, jnp.count_nonzero(out).astype(dt),
                       jnp.asarray(switched).astype(dt), ctr.value(_ext.ALGORITHM_IDS[algo])])
    assert stats.shape == (len(STATS_FIELDS),)
    return out, stats


# --------------------------------------------------------------------------- #
# per-device state when the number of devices changes
# --------------------------------------------------------------------------- #
def resize_residuals(residual, new_size: int):
    """Residuals stacked per device (leading axis P) -> the same for ``new_size`` devices.

    Error feedback owes the model ``sum_i residual_i / P`` (what the ranks kept
    back, averaged like the updates). Giving each of the P' new devices the
    mean of the old residuals owes exactly the same:
    ``sum_j mean / P' = sum_i residual_i / P``. With the same P, restore the
    checkpointed residuals as they are instead (bit-exact continuation).

    Args:
      residual: a pytree whose leaves have a leading axis of the old device
        count (e.g. ``opt_state[0].residual`` gathered to the host).
      new_size: the new number of devices P'.

    Returns:
      The same pytree with leading axis ``new_size``.
    """
    if not isinstance(new_size, int) or new_size < 1:
        raise ValueError(f"jax_sparse_sync.resize_residuals: `new_size` must be a positive int; "
                         f"got {new_size!r}")

    def resize(x):
        x = jnp.asarray(x)
        if x.ndim == 0:
            raise ValueError("jax_sparse_sync.resize_residuals: leaves need a leading device axis")
        mean = jnp.mean(x.astype(jnp.float32), axis=0).astype(x.dtype)
        return jnp.broadcast_to(mean, (new_size,) + x.shape[1:])

    return jax.tree_util.tree_map(resize, residual)
