"""The alpha-beta cost model of every sparse allreduce algorithm.

One source of truth for (a) the bytes each algorithm puts on the wire, in the
same counting convention as the C++ statistics (see ``stats.py``), and (b) the
predicted time ``messages * alpha + bytes_sent * beta`` that ``algorithm="auto"``
minimises. Notation as SparCML: P ranks, N dimension, k entries per rank; a
sparse entry is 8 bytes (int32 index + float32 value), a dense one 4.

Formulas (bytes this rank sends):

=====================  ======================================================
dense                  2 (P-1)/P * 4N                      (Rabenseifner)
split_allgather        slice sizes 8 (P-1) + phase 1 in [0, 8k] + block sizes
                       8 (P-1) + phase 2 (P-1) * [0, min(8 P k, 4 len)]
                       (len = N/P, this rank's range; a range past len/2
                       travels dense)
dsar_split_allgather   slice sizes 8 (P-1) + phase 1 in [0, 8k] + phase 2
                       (P-1) * 4 ceil(N/P) exactly (dense allgather of the
                       ranges, each padded to the longest)
hash_partition (ZEN)   slice sizes 8 (P-1) + phase 1 in [0, 8k] + block sizes
                       8 (P-1) + phase 2 (P-1) * [0, 8 min(P k, N)] (always
                       sparse); typical 8k (P-1)/P + (P-1) * 8k whatever the
                       support, since the owners are a hash of the index
allgather (TopkA)      (P-1) * 8k
recursive_doubling     between log2(P) * 8k (all ranks pick the same
                       indices) and sum_r min(2^r * 8k, 4N) (disjoint
                       indices; the stream turns dense past delta = N/2)
=====================  ======================================================

Besides these bounds, ``WireVolume.bytes_typical`` is what a top-k selection of
gradients typically sends: the ranks' indices disjoint and spread over the P
ranges in proportion to their lengths (phase 1 of split-allgather then sends
(P-1)/P of the k entries, and each range merges k entries, not the worst case
P k). It differs from ``bytes_max`` only for the split-allgather algorithms,
where the worst case (every rank's k entries in one range) is P times the
typical block. ``algorithm="auto"`` ranks by the worst case (a bound every
rank agrees on); :func:`predict_step_time` can take either (``volume=``).

Every call also pays the argument check: an allgather of a 56-byte header.

Step time. A training step with a sync transform costs its compute, the
transform's local O(N) work (accumulating the residual, selecting, writing
the dense result, cutting it into the update's leaves) and the wire time.
The local work is a calibrated term of its own, ``fixed + per_entry * N +
per_kept * k`` per transform (:data:`LOCAL_WORK_KINDS`; fitted by
``jss.planning.calibrate(local=True)`` at two sizes and two densities, on every rank at
once, so it includes the contention of ranks that share a host): the O(N)
passes and, for the sparse transforms, the O(k) work that grows with the
entries kept (sorting and merging them, the residual's and the result's
scatters). :func:`predict_step_time` adds the three. Measurements: docs/results.md.
Ok-Topk and the block-sparse allreduce have their own functions
(:func:`oktopk_volume`, :func:`oktopk_sync_volume` for the transform's step,
:func:`block_volume`): their volume depends on the
selection and on how many blocks hold a nonzero. ``jss.chunked_topk_sync``'s
allgather of fixed-size payloads (chunk offsets, packed value codes, per-chunk
scales) has :func:`chunked_topk_volume`, exact: (P-1) * the payload's bytes.
"""

from __future__ import annotations

import dataclasses
import math

__all__ = [
    "ALGORITHMS",
    "AlphaBeta",
    "DEFAULT_ALPHA_BETA",
    "HEADER_BYTES",
    "ENTRY_BYTES",
    "VALUE_BYTES",
    "WireVolume",
    "VOLUMES",
    "wire_volume",
    "predict_time",
    "choose_algorithm",
    "current_alpha_beta",
    "oktopk_volume",
    "oktopk_sync_volume",
    "block_volume",
    "chunked_topk_payload_bytes",
    "chunked_topk_volume",
    "set_alpha_beta",
    "LOCAL_WORK_KINDS",
    "local_work_time",
    "sync_wire_time",
    "predict_step_time",
]

# On a tie (e.g. P = 1, where nothing travels) the earlier one wins. hash_partition's
# worst case is never below split_allgather's (same phase 1, no dense phase 2), so
# "auto", which ranks by the worst case, considers it but picks split_allgather on ties;
# its advantage is the typical count on skewed supports (see docs/topics/wire_formats.md).
ALGORITHMS = ("allgather", "recursive_doubling", "split_allgather", "dsar_split_allgather",
              "dense", "hash_partition")
#: Which of a WireVolume's counts a prediction uses (see ``WireVolume.bytes``).
VOLUMES = ("min", "typical", "max")
HEADER_BYTES = 56   # CallHeader: 7 x int64
ENTRY_BYTES = 8     # int32 index + float32 value
VALUE_BYTES = 4     # float32
COUNT_BYTES = 8     # the int64 count sent before each point-to-point stream
#: Ok-Topk's exact global threshold: one allreduce of int64 counts per radix round.
THRESHOLD_HISTOGRAM_BINS = (256, 256, 256, 128)


#: Sync transforms whose local work the model knows (``jss.<kind>``'s update).
#: The transforms with a local-work term; ``topk_sync_group`` is one group of a
#: grouped ``topk_sync`` (its fixed part is per group: a top-k, a start, a done, a
#: worker thread), the term the grouping planner charges each group.
LOCAL_WORK_KINDS = ("dense_sync", "topk_sync", "topk_sync_threshold", "oktopk_sync",
                    "topk_sync_group", "dense_sync_group")
#: kinds that keep every entry (no per-kept term): ``dense_sync_group`` is one group
#: of a grouped dense sync (``grouped_topk_sync(plan, density=1.0, algorithm="dense")``)
DENSE_LOCAL_WORK_KINDS = ("dense_sync", "dense_sync_group")


@dataclasses.dataclass(frozen=True)
class AlphaBeta:
    """Latency per message (s) and time per byte (s/B) of the transport, and the
    local work of each sync transform's update.

    ``local`` holds ``(kind, fixed_s, per_entry_s, per_kept_s)`` tuples, one per
    calibrated kind of :data:`LOCAL_WORK_KINDS` (a tuple, so the parameters stay
    hashable; a triple without ``per_kept_s``, as files written before it hold,
    means 0 per kept entry); an empty tuple means not calibrated: the local
    term is then 0.
    """

    alpha: float
    beta: float
    local: tuple = ()
    #: contention (ASC-WFBP): two operations on the wire at once each run at
    #: ``gamma * beta`` per byte (1: no contention, 2: they share the link)
    gamma: float = 1.0
    #: bytes a link that has been idle passes at once before ``beta`` applies (a token
    #: bucket: a shaper such as ``tc tbf``, the emulated links' 256 KiB); 0: none. Not
    #: fitted by ``calibrate`` (its back-to-back exchanges drain the bucket): a
    #: stated property of the link. The planner's simulator takes it as
    #: ``Link.burst_s = beta * burst_bytes`` (``jss.planning.plan_grouping``).
    burst_bytes: float = 0.0

    def local_work(self, kind: str) -> tuple[float, float, float]:
        """``(fixed_s, per_entry_s, per_kept_s)`` of ``kind``'s local work; zeros if
        not calibrated."""
        if kind not in LOCAL_WORK_KINDS:
            raise ValueError(f"unknown local-work kind {kind!r}; expected one of {LOCAL_WORK_KINDS}")
        for name, fixed, per_entry, *per_kept in self.local:
            if name == kind:
                return float(fixed), float(per_entry), float(per_kept[0]) if per_kept else 0.0
        return 0.0, 0.0, 0.0


#: Uncalibrated defaults: 10 us per message, 1 GB/s.
DEFAULT_ALPHA_BETA = AlphaBeta(alpha=10e-6, beta=1e-9)

_current = DEFAULT_ALPHA_BETA


def current_alpha_beta() -> AlphaBeta:
    """The parameters ``algorithm="auto"`` uses: the defaults, or the last
    ``jss.planning.calibrate`` / ``set_alpha_beta`` (or the file in ``$JSS_ALPHA_BETA``)."""
    return _current


def set_alpha_beta(params: AlphaBeta) -> None:
    """Sets the parameters ``algorithm="auto"`` uses. Set the same on every rank."""
    global _current
    if not (params.alpha >= 0 and params.beta > 0):
        raise ValueError(f"set_alpha_beta: need alpha >= 0 and beta > 0; got {params}")
    _current = params


@dataclasses.dataclass(frozen=True)
class WireVolume:
    """Bytes this rank sends and messages it starts; ``*_max`` is the worst case,
    ``bytes_typical`` the count for disjoint indices spread evenly over the ranks'
    ranges (``bytes_max`` where not given: the worst case does not depend on the
    spread)."""

    bytes_min: int
    bytes_max: int
    messages: int
    bytes_typical: int | None = None

    def __post_init__(self):
        if self.bytes_typical is None:
            object.__setattr__(self, "bytes_typical", self.bytes_max)

    def bytes(self, volume: str = "max") -> int:
        """``bytes_min``, ``bytes_typical`` or ``bytes_max`` (``volume``: one of
        :data:`VOLUMES`)."""
        if volume not in VOLUMES:
            raise ValueError(f"volume must be one of {VOLUMES}; got {volume!r}")
        return {"min": self.bytes_min, "typical": self.bytes_typical,
                "max": self.bytes_max}[volume]


INDEX_HEADER_BYTES = 5  # an encoded message's kind byte + uint32 count (index_encoding="auto")


def index_bytes_bounds(m: int) -> tuple[int, int]:
    """Smallest and largest bytes of the encoded indices of a message of ``m`` sorted
    distinct indices (``index_encoding="auto"``, :mod:`jax_sparse_sync.ops.index_encoding`'s
    format, header included): ``m`` adjacent indices (a gap width of 0, or a bitmap)
    and the list ``5 + 4m``, which the chosen encoding never exceeds."""
    if m == 0:
        return INDEX_HEADER_BYTES, INDEX_HEADER_BYTES
    listed = INDEX_HEADER_BYTES + 4 * m
    adjacent = min(listed, INDEX_HEADER_BYTES + 5, INDEX_HEADER_BYTES + 4 + -(-m // 8))
    return adjacent, listed


def index_bytes_typical(m: int, span: int) -> int:
    """Bytes of the chosen encoding of ``m`` indices drawn uniformly from ``span``
    positions: the list, a bitmap of the span, or gaps in the bit length of the
    expected largest gap (about ``span/m * ln m``), whichever is smallest."""
    if m == 0:
        return INDEX_HEADER_BYTES
    span = max(span, m)
    largest_gap = int(span / m * max(1.0, math.log(m)))
    width = max(0, largest_gap - 1).bit_length()
    return min(INDEX_HEADER_BYTES + 4 * m, INDEX_HEADER_BYTES + 5 + ((m - 1) * width + 7) // 8,
               INDEX_HEADER_BYTES + 4 + (span + 7) // 8)


@dataclasses.dataclass(frozen=True)
class _Messages:
    """Bytes of one sparse message of m entries in a wire format (``ffi/collectives/wire_codec.h``)."""

    value_bytes: int = VALUE_BYTES
    encoded: bool = False

    def most(self, m: int) -> int:
        return self.value_bytes * m + (index_bytes_bounds(m)[1] if self.encoded else 4 * m)

    def least(self, m: int) -> int:
        return self.value_bytes * m + (index_bytes_bounds(m)[0] if self.encoded else 4 * m)

    def typical(self, m: int, span: int) -> int:
        return self.value_bytes * m + (index_bytes_typical(m, span) if self.encoded else 4 * m)


def _log2_ceil(p: int) -> int:
    return max(0, math.ceil(math.log2(p))) if p > 1 else 0


def _header(p: int) -> tuple[int, int]:
    return HEADER_BYTES * (p - 1), _log2_ceil(p)


def wire_volume(algorithm: str, *, nranks: int, size: int, k: int, rank: int = 0,
                quantize_bits: int = 0, qsgd_bucket: int = 1024, wire_dtype: int = 0,
                index_encoding: str = "int32") -> WireVolume:
    """Bytes ``rank`` sends in one call of ``algorithm`` with k entries per rank.

    For ``dense`` and ``allgather`` min == max == the exact count the C++ code
    reports. For ``recursive_doubling`` the exact count depends on how the
    ranks' indices overlap; min and max bound it (full overlap / no overlap).
    ``quantize_bits`` (DSAR only): the dense phase travels as QSGD codes, one
    float32 scale per ``qsgd_bucket`` entries plus ``bits`` per entry.
    ``wire_dtype`` (0 float32, 1 bfloat16, 2 float16): 2-byte values, in the
    sparse messages and the dense phases (``dense``: the 16-bit wire's
    ``2 (P-1) ceil(N/P)`` entries of 2 bytes). ``index_encoding="auto"``: each
    sparse message's indices encoded (:func:`index_bytes_bounds` bound them; the
    typical count assumes uniform indices, :func:`index_bytes_typical`), and
    ``allgather`` gathers its 8-byte message sizes first; with it ``allgather``'s
    min and max are bounds, not the exact count.
    """
    p, n = nranks, size
    hb, hm = _header(p)
    vb = VALUE_BYTES if wire_dtype == 0 else 2
    msg = _Messages(vb, index_encoding == "auto")
    if p == 1:
        return WireVolume(hb, hb, hm)
    if algorithm == "dense":
        if wire_dtype:
            b = 2 * (p - 1) * (-(-n // p)) * 2
            return WireVolume(hb + b, hb + b, hm + (p - 1) + _log2_ceil(p))
        b = 2 * (p - 1) * n * VALUE_BYTES // p
        return WireVolume(hb + b, hb + b, hm + 2 * _log2_ceil(p))
    if algorithm == "allgather":
        if msg.encoded:
            sizes = COUNT_BYTES * (p - 1)
            return WireVolume(hb + sizes + (p - 1) * msg.least(k),
                              hb + sizes + (p - 1) * msg.most(k), hm + 2 * _log2_ceil(p),
                              hb + sizes + (p - 1) * msg.typical(k, n))
        b = (p - 1) * msg.most(k)
        return WireVolume(hb + b, hb + b, hm + _log2_ceil(p))
    if algorithm == "recursive_doubling":
        return _recursive_doubling_volume(p, n, k, rank, msg, vb, hb, hm)
    if algorithm in ("split_allgather", "dsar_split_allgather"):
        return _split_allgather_volume(algorithm, p, n, k, rank, msg, vb, hb, hm,
                                       quantize_bits, qsgd_bucket)
    if algorithm == "hash_partition":
        return _hash_partition_volume(p, n, k, msg, hb, hm)
    raise ValueError(f"unknown algorithm {algorithm!r}; expected one of {ALGORITHMS}")


def _recursive_doubling_volume(p, n, k, rank, msg, vb, hb, hm) -> WireVolume:
    """:func:`wire_volume` of ``recursive_doubling`` (``hb``, ``hm``: the argument
    check's bytes and messages; ``msg``: the sparse messages' format; ``vb``: bytes
    of a value)."""
    p2 = 1 << (p.bit_length() - 1)
    rounds = p2.bit_length() - 1
    delta = n // 2

    def stream_bytes(entries: int, bound=msg.most) -> int:
        return COUNT_BYTES + (vb * n if entries > delta else bound(entries))

    extra = p - p2
    if rank >= p2:  # folded rank: sends its own stream once, gets the result back
        return WireVolume(hb + stream_bytes(k, msg.least), hb + stream_bytes(k), hm + 2)

    def group_max(r: int) -> int:
        # Worst case (disjoint indices): a round-r stream holds the entries of
        # every rank in its group of 2^r slots; slots below `extra` carry a
        # folded rank's entries too.
        base = rank & ~((1 << r) - 1)
        slots = range(base, base + (1 << r))
        return min(n, sum(2 * k if s < extra else k for s in slots))

    lo = hi = 0
    msgs = 0
    for r in range(rounds):
        lo += stream_bytes(k, msg.least)
        hi += stream_bytes(group_max(r))
        msgs += 2
    if rank < extra:  # hands the result to its folded partner
        lo += stream_bytes(k, msg.least)
        hi += stream_bytes(min(n, (p2 + extra) * k))
        msgs += 2
    return WireVolume(hb + lo, hb + hi, hm + msgs)


def _split_allgather_volume(algorithm, p, n, k, rank, msg, vb, hb, hm, quantize_bits,
                            qsgd_bucket) -> WireVolume:
    """:func:`wire_volume` of ``split_allgather`` and ``dsar_split_allgather`` (the
    arguments as :func:`_recursive_doubling_volume`'s)."""
    length = n * (rank + 1) // p - n * rank // p
    counts = COUNT_BYTES * (p - 1)  # slice sizes (alltoall)
    msgs = hm + (p - 1)
    # at most one message per other owner, k entries in all (more headers when encoded)
    lo = hb + counts
    hi = lo + msg.most(k) + (INDEX_HEADER_BYTES * (p - 2) if msg.encoded and k else 0)
    # typical: k * length / n of this rank's entries fall in its own range, k / P
    # (over a range of N / P) in each other owner's
    if msg.encoded:
        typ = lo + (p - 1) * msg.typical(k // p, n // p)
    else:
        typ = hi - msg.most(k * length // n)
    msgs += p - 1  # phase 1, at most one message per peer
    if algorithm == "dsar_split_allgather":
        # every owner's block is padded to the largest (one MPI_Allgather)
        longest = -(-n // p)
        if quantize_bits:
            block = max(VALUE_BYTES * (-(-m // qsgd_bucket)) + (m * quantize_bits + 7) // 8
                        for m in {n // p, longest})
        else:
            block = vb * longest
        phase2 = (p - 1) * block
        return WireVolume(lo + phase2, hi + phase2, msgs + _log2_ceil(p), typ + phase2)
    sizes = COUNT_BYTES * (p - 1)  # block descriptors (allgather)
    block_max = min(msg.most(min(p * k, length)), vb * length)
    # typical: each of the P ranks puts k * length / n entries in this range
    block_typ = min(msg.typical(min(p * (k * length // n), length), length), vb * length)
    return WireVolume(lo + sizes, hi + sizes + (p - 1) * block_max, msgs + 2 * _log2_ceil(p),
                      typ + sizes + (p - 1) * block_typ)


def _hash_partition_volume(p, n, k, msg, hb, hm) -> WireVolume:
    """:func:`wire_volume` of ``hash_partition`` (the arguments as
    :func:`_recursive_doubling_volume`'s)."""
    counts = COUNT_BYTES * (p - 1)  # slice sizes (alltoall)
    sizes = COUNT_BYTES * (p - 1)   # merged stream sizes (allgather)
    msgs = hm + 2 * (p - 1) + 2 * _log2_ceil(p)
    base = hb + counts + sizes
    headers = INDEX_HEADER_BYTES * (p - 2) if msg.encoded and k else 0  # phase 1's extra
    hi = base + msg.most(k) + headers + (p - 1) * msg.most(min(p * k, n))
    # typical: (P-1)/P of the k entries go to other owners; each owner merges
    # about k entries (P ranks x k/P, disjoint), for any support: the hash spreads it
    if msg.encoded:
        typ = base + (p - 1) * msg.typical(k // p, n) + (p - 1) * msg.typical(min(k, n), n)
    else:
        typ = base + msg.most(k * (p - 1) // p) + (p - 1) * msg.most(min(k, n))
    # an owner's merged stream may be empty: an encoded one is then its header alone
    lo = base + (p - 1) * (INDEX_HEADER_BYTES if msg.encoded else 0)
    return WireVolume(lo, hi, msgs, typ)


def oktopk_volume(*, nranks: int, k: int, recompute_boundaries: bool = True,
                  recompute_threshold: bool = True, wire_dtype: int = 0,
                  partition: str = "regions") -> WireVolume:
    """Bytes a rank sends in one Ok-Topk call, control messages included.

    Payload bounds from the paper: between 2k (P-1)/P and 6k (P-1)/P words
    (4 bytes each), averaged over ranks, when about k entries are selected
    globally; ``wire_dtype`` 1 or 2 (16-bit values): an entry is 6 bytes instead
    of 8, so the payload is 3/4 of that. Control: the 56-byte argument check, slice and share sizes
    (8 bytes to each peer each), the boundary allreduce (P-1 int64) and the
    histogram allreduces of the exact threshold (THRESHOLD_HISTOGRAM_BINS int64).

    ``partition="hash"`` (hash owners): no regions, so no boundary allreduce
    whatever ``recompute_boundaries`` says; the payload bounds are the same (each
    owner's selection is bounded as a region's is). What the hash owners change is
    which rank carries the payload on a skewed support (each about 1/P of it),
    which a per-rank bound over ranks does not see.
    """
    if partition not in ("regions", "hash"):
        raise ValueError(f"oktopk_volume: `partition` must be 'regions' or 'hash'; "
                         f"got {partition!r}")
    recompute_boundaries = recompute_boundaries and partition == "regions"
    p = nranks
    hb, hm = _header(p)
    if p == 1:
        return WireVolume(hb, hb, hm)
    control = hb + 2 * COUNT_BYTES * (p - 1)
    msgs = hm + (p - 1) + _log2_ceil(p)
    if recompute_boundaries:
        control += 2 * (p - 1) * (p - 1) * COUNT_BYTES // p
        msgs += 2 * _log2_ceil(p)
    if recompute_threshold:
        for bins in THRESHOLD_HISTOGRAM_BINS:
            control += 2 * (p - 1) * bins * COUNT_BYTES // p
        msgs += 2 * len(THRESHOLD_HISTOGRAM_BINS) * _log2_ceil(p)
    entry = ENTRY_BYTES if not wire_dtype else ENTRY_BYTES - 2
    return WireVolume(control + k * (p - 1) * entry // p,
                      control + 3 * k * (p - 1) * entry // p,
                      msgs + 2 * (p - 1))


def oktopk_sync_volume(*, nranks: int, k: int, capacity_factor: float = 2.0,
                       region_band: tuple[float, float] | None = (0.5, 2.0),
                       recompute_boundaries: bool = False,
                       recompute_threshold: bool = False, wire_dtype: int = 0,
                       partition: str = "regions") -> WireVolume:
    """Bytes a rank sends in one :func:`jss.oktopk_sync` step, from its counts.

    The transform's step is one :func:`oktopk_volume` call whose payload the
    transform's own bounds fix (defaults: ``oktopk_sync``'s): the reused local
    threshold keeps up to ``capacity_factor * k`` entries (more overflow into
    the exact top-k), of which the (P-1)/P outside this rank's region go to
    their owners; then this rank's region keeps at most ``floor(hi k / P)``
    (``region_band``) and sends them to each of the P-1 others, 8 bytes an
    entry. ``bytes_max`` is that worst case, ``bytes_min`` k local entries and
    ``ceil(lo k / P)`` kept. Without a band (``None``) the global count swings
    up to about 3k (the paper's rule), which ``bytes_max`` takes. The paper's
    [2k, 6k] (P-1)/P words of :func:`oktopk_volume` assume about k entries on
    both sides; the transform's steps in training can send more. ``wire_dtype`` 1 or 2:
    6-byte entries. ``partition="hash"``: as :func:`oktopk_volume`'s (no boundary
    allreduce; ``region_band`` bounds each hash owner as it bounds a region).
    """
    p = nranks
    control = oktopk_volume(nranks=p, k=0, recompute_boundaries=recompute_boundaries,
                            recompute_threshold=recompute_threshold, partition=partition)
    if p == 1:
        return control
    lo, hi = region_band if region_band is not None else (0.0, 3.0)
    capacity = max(k, int(capacity_factor * k))
    region_min = math.ceil(lo * k / p)
    region_max = max(region_min, math.floor(hi * k / p))
    entry = ENTRY_BYTES if not wire_dtype else ENTRY_BYTES - 2
    return WireVolume(control.bytes_min + entry * ((p - 1) * k // p + (p - 1) * region_min),
                      control.bytes_max + entry * ((p - 1) * capacity // p
                                                   + (p - 1) * region_max),
                      control.messages)


def block_volume(*, nranks: int, size: int, block_size: int, nonzero_blocks: int,
                 result_blocks: int) -> WireVolume:
    """Bytes a rank sends in the block-sparse allreduce, when its nonzero
    blocks and the result's spread evenly over the owners' ranges.

    Each owner range gets a bitmap (1 bit per block) and this rank's nonzero
    blocks in it; then the owner sends its nonzero result blocks (and bitmap)
    to the P-1 others. Exact for a given layout: see tests/reference.py.
    """
    p = nranks
    hb, hm = _header(p)
    if p == 1:
        return WireVolume(hb, hb, hm)
    nb = -(-size // block_size)
    bitmap = (nb // p + 7) // 8
    block_bytes = VALUE_BYTES * block_size
    phase1 = (p - 1) * bitmap + block_bytes * nonzero_blocks * (p - 1) // p
    phase2 = (p - 1) * (bitmap + block_bytes * result_blocks // p)
    b = hb + 2 * COUNT_BYTES * (p - 1) + phase1 + phase2
    return WireVolume(b, b, hm + 2 * (p - 1) + _log2_ceil(p))


def chunked_topk_payload_bytes(*, size: int, chunk: int, k_per_chunk: int, value_bits: int = 2,
                               value_bytes: int = 0) -> int:
    """Bytes of one rank's payload in ``jss.chunked_topk_sync``'s allgather.

    ``ceil(size / chunk)`` chunks of ``k_per_chunk`` slots each (a last chunk
    shorter than ``k_per_chunk`` is padded to it): every slot's offset within
    its chunk (2 bytes while ``chunk <= 65535``, else 4), then the values:
    ``value_bits`` in {2, 4, 8} packed ``8 / value_bits`` to a byte, plus one
    float32 scale per chunk; or, with ``value_bits=0``, ``value_bytes`` (2
    bfloat16, 4 float32) per slot and no scale.

    Example:
      >>> from jax_sparse_sync.model import cost_model as cm
      >>> cm.chunked_topk_payload_bytes(size=4096, chunk=4096, k_per_chunk=64)  # 128 + 16 + 4
      148
    """
    chunks = -(-size // chunk)
    slots = chunks * k_per_chunk
    offsets = slots * (2 if chunk < 65536 else 4)
    if value_bits:
        return offsets + -(-slots * value_bits // 8) + 4 * chunks
    return offsets + slots * value_bytes


def chunked_topk_volume(*, nranks: int, size: int, chunk: int, k_per_chunk: int,
                        value_bits: int = 2, value_bytes: int = 0) -> WireVolume:
    """Bytes a rank sends in one step of ``jss.chunked_topk_sync``, exactly: the
    header check, then its payload (:func:`chunked_topk_payload_bytes`) to each of
    the P - 1 others (an allgather of fixed-size payloads; it receives as many)."""
    hb, hm = _header(nranks)
    if nranks == 1:
        return WireVolume(hb, hb, hm)
    payload = chunked_topk_payload_bytes(size=size, chunk=chunk, k_per_chunk=k_per_chunk,
                                         value_bits=value_bits, value_bytes=value_bytes)
    b = hb + (nranks - 1) * payload
    return WireVolume(b, b, hm + (_log2_ceil(nranks) if payload else 0))


def predict_time(algorithm: str, *, nranks: int, size: int, k: int,
                 params: AlphaBeta | None = None, worst_case: bool = True,
                 volume: str | None = None, **variant) -> float:
    """Predicted seconds for one call (rank 0's view); ``params`` defaults to
    :func:`current_alpha_beta`. The bytes are ``volume``'s (:data:`VOLUMES`; by
    default ``"max"``, or ``"min"`` with ``worst_case=False``)."""
    params = params or current_alpha_beta()
    v = wire_volume(algorithm, nranks=nranks, size=size, k=k, **variant)
    b = v.bytes(volume or ("max" if worst_case else "min"))
    return v.messages * params.alpha + b * params.beta


def choose_algorithm(*, nranks: int, size: int, k: int,
                     params: AlphaBeta | None = None) -> str:
    """The algorithm with the lowest predicted worst-case time.

    Depends only on (P, N, k) and the model parameters, so every rank that
    passes the same arguments picks the same algorithm.
    """
    return min(ALGORITHMS, key=lambda a: predict_time(a, nranks=nranks, size=size, k=k,
                                                      params=params))


def local_work_time(kind: str, *, size: int, k: int = 0, params: AlphaBeta | None = None) -> float:
    """Predicted seconds of ``kind``'s local work for ``size`` gradient entries of
    which ``k`` are kept (``fixed + per_entry * size + per_kept * k``; ``k`` is
    ignored by ``dense_sync``, which keeps everything at no extra cost)."""
    fixed, per_entry, per_kept = (params or current_alpha_beta()).local_work(kind)
    return fixed + per_entry * size + (per_kept * k if kind not in DENSE_LOCAL_WORK_KINDS
                                       else 0.0)


def sync_wire_time(kind: str, *, nranks: int, size: int, k: int, algorithm: str = "auto",
                   params: AlphaBeta | None = None, volume: str = "max",
                   wire_dtype: int = 0) -> float:
    """Predicted seconds on the wire of one step of the sync transform ``kind``
    (``"auto"`` resolved as the transform resolves it, by the worst case).

    ``volume`` (:data:`VOLUMES`): ``"max"``, the worst case, is what the static
    shapes of the axis transport send and close to what the MPI transport sends
    for top-k selections with allgather and recursive doubling; ``"typical"``
    also fits split-allgather's, whose worst case is P times its typical block
    (module doc). Ok-Topk's count is its transform's bound either way.
    ``wire_dtype`` (as :func:`wire_volume`'s: 0 float32, 1 bfloat16, 2 float16)
    is the transform's ``wire_dtype``, e.g. 1 for the bf16 dense baseline
    ``dense_sync(wire_dtype=jnp.bfloat16)``; ``auto`` still ranks the
    algorithms by their float32 bytes, as the transforms do."""
    params = params or current_alpha_beta()
    if kind == "dense_sync":
        return predict_time("dense", nranks=nranks, size=size, k=size, params=params,
                            volume=volume, wire_dtype=wire_dtype)
    if kind == "oktopk_sync":
        v = oktopk_sync_volume(nranks=nranks, k=k, wire_dtype=wire_dtype)
        return v.messages * params.alpha + v.bytes(volume) * params.beta
    if algorithm == "auto":
        algorithm = choose_algorithm(nranks=nranks, size=size, k=k, params=params)
    return predict_time(algorithm, nranks=nranks, size=size, k=k, params=params, volume=volume,
                        wire_dtype=wire_dtype)


def predict_step_time(kind: str, *, nranks: int, size: int, k: int, compute_s: float,
                      algorithm: str = "auto", params: AlphaBeta | None = None,
                      volume: str = "max", wire_dtype: int = 0) -> float:
    """Predicted seconds of a training step: ``compute_s`` (the step without any
    sync, measured) + the transform's local work + its wire time
    (:func:`sync_wire_time`, with ``volume``'s bytes and ``wire_dtype``'s values).

    Example:
      >>> from jax_sparse_sync.model import cost_model as cm
      >>> ab = cm.AlphaBeta(alpha=50e-6, beta=8e-9, local=(("topk_sync", 1e-3, 2e-9, 8e-8),))
      >>> round(cm.predict_step_time("topk_sync", nranks=4, size=7_500_000, k=7_500,
      ...                            compute_s=0.1, algorithm="allgather", params=ab), 4)
      0.1182
    """
    return (compute_s + local_work_time(kind, size=size, k=k, params=params)
            + sync_wire_time(kind, nranks=nranks, size=size, k=k, algorithm=algorithm,
                             params=params, volume=volume, wire_dtype=wire_dtype))
