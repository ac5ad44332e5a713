"""Selection ops (XLA FFI custom calls with C++ kernels).

* :func:`topk`: exact top-k by magnitude (11-bit radix select, multi-threaded);
* :func:`bucket_topk`: top-k inside every bucket of consecutive entries;
* :func:`threshold_select`: ``|x| >= threshold`` compacted into a fixed capacity;
* :func:`kth_magnitude` / :func:`estimate_threshold`: the k-th largest ``|x|``,
  exact, from a strided sample, or from a Gaussian fit;
* :func:`residual_update`: zero selected entries in place (error feedback);
* :func:`scatter_add`: add a sparse ``(values, indices)`` vector into a dense one in place.

Every op takes float32, bfloat16 or float16 without casting. NaN policy:
a NaN's magnitude ranks above ``+inf``, so selections always pick NaNs (a
diverging gradient is seen by the sync instead of hiding in a residual);
:func:`scatter_add` follows IEEE arithmetic (NaN in, NaN out).

Threads: on CPU, inputs of 256K entries or more are cut into fixed chunks
over the machine's threads, divided by the MPI ranks on the node under
``mpiexec`` (``MPI_LOCALNRANKS`` / ``OMPI_COMM_WORLD_LOCAL_SIZE``;
``JSS_NUM_THREADS=<t>`` sets the count, read at every call); the chunks' outputs are placed by prefix sums, so every result
is bitwise the same for any thread count.
"""

from __future__ import annotations

import operator

import jax
import jax.numpy as jnp
import numpy as np

from jax_sparse_sync import _ext  # noqa: F401  (registers the FFI targets)

__all__ = ["topk", "bucket_topk", "threshold_select", "kth_magnitude", "estimate_threshold",
           "residual_update", "scatter_add", "SELECTION_DTYPES", "THRESHOLD_METHODS"]

#: Input dtypes the selection kernels accept.
SELECTION_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


def check_selection_dtype(x: jax.Array, op: str, arg: str = "x") -> None:
    if x.dtype not in SELECTION_DTYPES:
        kind = "integer" if jnp.issubdtype(x.dtype, jnp.integer) else str(x.dtype)
        raise TypeError(
            f"jax_sparse_sync.{op}: `{arg}` has dtype {x.dtype} ({kind}); selection works on "
            f"float32, bfloat16 or float16. Cast it first, e.g. `{arg}.astype(jnp.float32)`."
        )


def check_k(k, n: int, op: str, name: str = "k") -> int:
    try:
        k = operator.index(k)
    except TypeError:
        raise TypeError(
            f"jax_sparse_sync.{op}: `{name}` must be a Python int known at trace time; got {k!r}"
        ) from None
    if not 0 <= k <= n:
        raise ValueError(
            f"jax_sparse_sync.{op}: `{name}` must be in [0, {n}]; got {name}={k}. "
            f"Use a smaller {name}, or a density in (0, 1]."
        )
    return k


def check_size(n: int, op: str, arg: str = "x") -> None:
    """Indices are int32: inputs must have fewer than 2**31 entries."""
    if n >= 2**31:
        raise ValueError(f"jax_sparse_sync.{op}: {arg}.size={n} needs int64 indices; the limit is "
                         "2**31 - 1 entries. Split the array and select per part.")


def empty_selection(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """No entries selected: empty (values, indices) on ``x``'s device (sliced from
    ``x`` rather than created, so a GPU input gives GPU results)."""
    none = x.reshape(-1)[:0]
    return none, none.astype(jnp.int32)


def _slots(length: int, dtype) -> tuple:
    """A selection's outputs: ``length`` values of ``dtype`` and their int32 indices."""
    return (jax.ShapeDtypeStruct((length,), dtype), jax.ShapeDtypeStruct((length,), jnp.int32))


def _values_and_indices(target: str, length: int, dtype):
    """The ffi_call of a selection kernel ``target`` that returns :func:`_slots`."""
    return jax.ffi.ffi_call(target, _slots(length, dtype), vmap_method="sequential")


def topk(x: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    """Exact top-k of ``|x|`` over ``x.ravel()``.

    A radix select on the magnitude bits with 11-bit digits (no sort): one
    histogram pass and one compaction pass over ``x``, then only the few
    candidates that share the k-th magnitude's top digit are refined. Inputs
    of 256K entries or more are split over the CPU's threads (the result does
    not depend on the thread count). Ties at the k-th magnitude go to the
    lower index, so the result is deterministic. NaN ranks above ``+inf`` (it
    is always selected, so a diverging gradient is seen by the sync rather
    than hidden in a residual).

    Args:
      x: float32, bfloat16 or float16 array of any shape, fewer than 2**31 entries.
      k: number of entries to keep, ``0 <= k <= x.size``.

    Returns:
      ``(values, indices)``: ``values`` keep their sign and ``x``'s dtype,
      ``indices`` are int32 positions in ``x.ravel()``. The k entries come in
      ascending index order, from the CPU and the CUDA kernel alike (callers
      rely on it: ``shared_support_sync``'s support).

    Example:
      >>> import jax.numpy as jnp, jax_sparse_sync as jss
      >>> v, i = jss.topk(jnp.array([0.1, -3.0, 2.0, 0.5]), 2)
      >>> i.tolist(), v.tolist()
      ([1, 2], [-3.0, 2.0])
    """
    x = jnp.asarray(x)
    check_selection_dtype(x, "topk")
    n = int(np.prod(x.shape, dtype=np.int64))
    k = check_k(k, n, "topk")
    check_size(n, "topk")
    if k == 0:
        return empty_selection(x)
    return _values_and_indices("jss_topk", k, x.dtype)(x.reshape(-1), k=np.int64(k))


def bucket_topk(x: jax.Array, k_per_bucket: int, bucket: int = 512) -> tuple[jax.Array, jax.Array]:
    """Top-k of ``|x|`` inside every bucket of ``bucket`` consecutive entries.

    SparCML's bucketed selection: cheaper than a global top-k and spreads the
    kept entries over the whole vector. Slot ``b * k_per_bucket + j`` belongs
    to bucket ``b``; a last bucket shorter than ``k_per_bucket`` is padded with
    value 0 and index -1 (the padding convention of :func:`sparse_allreduce`).
    Within a bucket ties go to the lower index and NaN ranks above ``+inf``
    (always kept), as in :func:`topk`. Buckets are split over the CPU's
    threads for large inputs (same result for any thread count).

    Args:
      x: float32, bfloat16 or float16 array of any shape (over ``x.ravel()``).
      k_per_bucket: entries kept per bucket, ``0 <= k_per_bucket <= bucket``.
      bucket: bucket length (512 in SparCML).

    Returns:
      ``(values, indices)`` of length ``ceil(x.size / bucket) * k_per_bucket``.

    Example:
      >>> import jax.numpy as jnp, jax_sparse_sync as jss
      >>> v, i = jss.bucket_topk(jnp.array([1., -5., 2., 0., 3., 0.5]), 1, bucket=4)
      >>> i.tolist(), v.tolist()
      ([1, 4], [-5.0, 3.0])
    """
    x = jnp.asarray(x)
    check_selection_dtype(x, "bucket_topk")
    if not isinstance(bucket, int) or bucket < 1:
        raise ValueError(f"jax_sparse_sync.bucket_topk: `bucket` must be a positive int; got {bucket!r}")
    k = check_k(k_per_bucket, bucket, "bucket_topk", "k_per_bucket")
    n = int(np.prod(x.shape, dtype=np.int64))
    if n >= 2**31:
        raise ValueError(f"jax_sparse_sync.bucket_topk: x.size={n} needs int64 indices; the limit is 2**31-1")
    cap = -(-n // bucket) * k
    if cap == 0:
        return empty_selection(x)
    return _values_and_indices("jss_bucket_topk", cap, x.dtype)(
        x.reshape(-1), bucket=np.int64(bucket), k=np.int64(k))


def threshold_select(x: jax.Array, threshold: float | jax.Array,
                     capacity: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Entries with ``|x| >= threshold`` (and ``x != 0``), compacted, in one pass.

    One read of ``x``, split over the CPU's threads for large inputs (the
    output is the same for any thread count). The comparison is exact in
    ``x``'s dtype: a 16-bit entry qualifies iff its float32 value is
    ``>= threshold``.

    Args:
      x: float32, bfloat16 or float16 array of any shape (over ``x.ravel()``),
        fewer than 2**31 entries.
      threshold: magnitude (may be traced, e.g. from an Optax state); a
        negative one selects every nonzero entry.
      capacity: static number of output slots.

    Returns:
      ``(values, indices, count)``: the first ``min(count, capacity)`` selected
      entries in index order, padded with value 0 and index -1; ``count`` (int32
      scalar) is how many qualified. ``count > capacity`` means overflow: the
      output is incomplete and the caller must fall back (the Optax transforms
      do, to exact top-k). NaN counts as above every threshold.

    Example:
      >>> import jax.numpy as jnp, jax_sparse_sync as jss
      >>> v, i, c = jss.threshold_select(jnp.array([0.5, -2.0, 0.1, 3.0]), 1.0, capacity=3)
      >>> v.tolist(), i.tolist(), int(c)
      ([-2.0, 3.0, 0.0], [1, 3, -1], 2)
    """
    x = jnp.asarray(x)
    check_selection_dtype(x, "threshold_select")
    n = int(np.prod(x.shape, dtype=np.int64))
    capacity = check_k(capacity, n, "threshold_select", "capacity")
    check_size(n, "threshold_select")
    call = jax.ffi.ffi_call(
        "jss_threshold_select",
        (*_slots(capacity, x.dtype), jax.ShapeDtypeStruct((), jnp.int32)),
        vmap_method="sequential",
    )
    return call(x.reshape(-1), jnp.asarray(threshold, jnp.float32).reshape(()),
                capacity=np.int64(capacity))


#: Methods of :func:`estimate_threshold`.
THRESHOLD_METHODS = ("exact", "sampled", "gaussian")


def _check_positive_int(v, op: str, name: str) -> int:
    try:
        v = operator.index(v)
    except TypeError:
        raise TypeError(f"jax_sparse_sync.{op}: `{name}` must be a Python int; got {v!r}") from None
    if v < 1:
        raise ValueError(f"jax_sparse_sync.{op}: `{name}` must be >= 1; got {name}={v}")
    return v


def kth_magnitude(x: jax.Array, k: int, *, stride: int = 1) -> jax.Array:
    """The k-th largest ``|x|`` over ``x.ravel()[::stride]``, as a float32 scalar.

    An exact radix select on the magnitude bits (11-bit digits, one
    histogram pass per digit over the input, no compaction and no sort),
    multi-threaded for large inputs. ``threshold_select(x, kth_magnitude(x, k),
    capacity)`` selects the top-k plus every entry tied with the k-th.

    NaN ranks above ``+inf``: with ``k`` at most the number of NaNs the result
    is NaN. ``k = 0`` gives ``+inf`` (a threshold that keeps no number).

    Args:
      x: float32, bfloat16 or float16 array of any shape (the result is exact:
        the k-th magnitude widened to float32).
      k: rank, ``0 <= k <= ceil(x.size / stride)`` (1 = the largest).
      stride: look only at every ``stride``-th entry (a strided sample).

    Returns:
      float32 scalar.

    Example:
      >>> import jax.numpy as jnp, jax_sparse_sync as jss
      >>> float(jss.kth_magnitude(jnp.array([0.5, -4.0, 2.0, -1.0]), 2))
      2.0
    """
    x = jnp.asarray(x)
    check_selection_dtype(x, "kth_magnitude")
    stride = _check_positive_int(stride, "kth_magnitude", "stride")
    n = int(np.prod(x.shape, dtype=np.int64))
    k = check_k(k, -(-n // stride), "kth_magnitude")
    call = jax.ffi.ffi_call("jss_kth_magnitude", jax.ShapeDtypeStruct((), jnp.float32),
                            vmap_method="sequential")
    return call(x.reshape(-1), k=np.int64(k), stride=np.int64(stride))


def sampled_rank(n: int, k: int, stride: int) -> int:
    """The rank in the strided sample that estimates rank ``k`` of ``n``:
    ``round(k * m / n)`` for a sample of ``m = ceil(n / stride)``, at least 1
    (0 only for ``k = 0``)."""
    m = -(-n // stride)
    if k == 0:
        return 0
    return min(m, max(1, int(round(k * m / n))))


def estimate_threshold(x: jax.Array, k: int, method: str = "exact", *,
                       sample_stride: int = 64) -> jax.Array:
    """A magnitude threshold that keeps about ``k`` entries of ``x``.

    * ``"exact"``: :func:`kth_magnitude` (``|x| >= t`` keeps exactly the top-k
      plus the entries tied with the k-th).
    * ``"sampled"``: the k-th magnitude of the strided sample
      ``x.ravel()[::sample_stride]`` (``m = ceil(N / sample_stride)`` entries)
      at the scaled rank ``k_s = round(k * m / N)`` (at least 1). If the
      magnitudes do not depend on position, it is the empirical
      ``1 - k/N`` quantile of ``|x|`` from ``m`` draws: the kept count is
      about ``k`` with a relative spread of about ``1 / sqrt(k_s)`` (3% at
      ``k_s = 1000``). Costs ``1/sample_stride`` of the exact pass; biased
      when the magnitudes are periodic with the stride.
    * ``"gaussian"`` (Gaussiank): ``|mean| + std * ndtri(1 - k / (2 N))``, the
      two-sided normal percent point; exact for normal data, far off for
      heavy-tailed data. Pure ``jnp``.

    NaN: ``"exact"`` and ``"sampled"`` rank NaN above ``+inf`` (the threshold
    is NaN when the sample's top ``k_s`` are NaN); ``"gaussian"`` returns NaN
    whenever ``x`` holds a NaN. A NaN threshold keeps only NaNs in
    :func:`threshold_select`. ``k = 0`` gives ``+inf`` (exact, sampled).

    Args:
      x: float32, bfloat16 or float16 array of any shape.
      k: the number of entries to keep, ``0 <= k <= x.size``.
      method: one of ``"exact"``, ``"sampled"``, ``"gaussian"``.
      sample_stride: sampling step of ``"sampled"`` (>= 1).

    Returns:
      float32 scalar.

    Example:
      >>> import jax, jax.numpy as jnp, jax_sparse_sync as jss
      >>> x = jax.random.normal(jax.random.key(0), (1 << 16,))
      >>> exact = float(jss.estimate_threshold(x, 655))
      >>> sampled = float(jss.estimate_threshold(x, 655, "sampled", sample_stride=8))
      >>> abs(sampled / exact - 1) < 0.1
      True
    """
    x = jnp.asarray(x)
    check_selection_dtype(x, "estimate_threshold")
    n = int(np.prod(x.shape, dtype=np.int64))
    k = check_k(k, n, "estimate_threshold")
    if method == "exact":
        return kth_magnitude(x, k)
    if method == "sampled":
        stride = _check_positive_int(sample_stride, "estimate_threshold", "sample_stride")
        return kth_magnitude(x, sampled_rank(n, k, stride), stride=stride)
    if method == "gaussian":
        from jax.scipy.special import ndtri

        a = x.reshape(-1).astype(jnp.float32)
        z = ndtri(1.0 - k / (2.0 * n)) if n else jnp.float32(jnp.inf)
        return (jnp.abs(jnp.mean(a)) + jnp.std(a) * z).astype(jnp.float32)
    raise ValueError(f"jax_sparse_sync.estimate_threshold: `method` must be one of "
                     f"{THRESHOLD_METHODS}; got {method!r}")


def _check_dense_update(dense, indices, op: str, dense_name: str):
    dense = jnp.asarray(dense)
    indices = jnp.asarray(indices)
    check_selection_dtype(dense, op, dense_name)
    if dense.ndim != 1:
        raise ValueError(f"jax_sparse_sync.{op}: `{dense_name}` must be 1-D; got shape "
                         f"{dense.shape}. Pass `{dense_name}.reshape(-1)`.")
    check_size(dense.shape[0], op, dense_name)
    if indices.ndim != 1 or indices.dtype != jnp.int32:
        raise TypeError(f"jax_sparse_sync.{op}: `indices` must be a 1-D int32 array; got "
                        f"{indices.dtype}{indices.shape}. Use `indices.astype(jnp.int32)`.")
    try:  # concrete indices are checked here; traced ones by the kernel
        concrete = np.asarray(indices)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        concrete = None
    if concrete is not None and concrete.size:
        bad = np.flatnonzero((concrete < -1) | (concrete >= dense.shape[0]))
        if bad.size:
            j = int(bad[0])
            raise ValueError(f"jax_sparse_sync.{op}: indices[{j}] = {int(concrete[j])} is outside "
                             f"[0, {dense.shape[0]}); use -1 for padding slots.")
    return dense, indices


def residual_update(acc: jax.Array, indices: jax.Array) -> jax.Array:
    """``acc`` with ``acc[i] = 0`` for every ``i`` in ``indices`` (``-1`` = padding).

    The error-feedback residual update: the selected entries were sent, so
    they leave the residual. The kernel writes into ``acc``'s buffer
    (``input_output_aliases``): under ``jax.jit(..., donate_argnums=...)`` with
    ``acc`` donated, no copy of the N-entry vector is made. Equal, bit for
    bit, to ``acc.at[indices].set(0)`` over the valid indices (a NaN entry
    that is selected becomes 0 like any other).

    Args:
      acc: 1-D float32, bfloat16 or float16 array (fewer than 2**31 entries).
      indices: 1-D int32 array; entries in ``[0, acc.size)`` or ``-1``. An
        index outside raises ``ValueError`` when the indices are concrete;
        when they are traced the CPU kernel raises and the GPU kernel skips
        it (checking would cost the GPU a host round trip).

    Returns:
      The updated ``acc`` (same dtype and shape).

    Example:
      >>> import jax.numpy as jnp, jax_sparse_sync as jss
      >>> jss.residual_update(jnp.array([1., 2., 3., 4.]), jnp.array([2, -1, 0], jnp.int32)).tolist()
      [0.0, 2.0, 0.0, 4.0]
    """
    acc, indices = _check_dense_update(acc, indices, "residual_update", "acc")
    call = jax.ffi.ffi_call("jss_residual_update", jax.ShapeDtypeStruct(acc.shape, acc.dtype),
                            vmap_method="sequential", input_output_aliases={0: 0})
    return call(acc, indices)


def scatter_add(dense: jax.Array, values: jax.Array, indices: jax.Array) -> jax.Array:
    """``dense`` with ``values[j]`` added at ``indices[j]`` for every slot ``j``.

    Slots are applied in order (``j`` ascending); ``-1`` marks padding. The
    sum at each index is accumulated in float32, starting from ``dense``'s
    value, and rounded to ``dense``'s dtype once (round to nearest even), so
    for float32 it is the sequential ``+=`` and for 16-bit floats it is more
    accurate than adding in 16 bits. The kernel writes into ``dense``'s
    buffer (``input_output_aliases``; donate it under ``jax.jit`` to avoid a
    copy). NaN/Inf follow IEEE arithmetic; a NaN result is a NaN on every
    platform, but its payload bits are the platform's (the GPU's arithmetic
    gives 0x7fffffff where the CPU passes on the NaN operand). Traced indices
    outside ``[0, dense.size)`` raise on the CPU and are skipped on the GPU.

    Args:
      dense: 1-D float32, bfloat16 or float16 array.
      values: 1-D array of ``dense``'s dtype, one per slot.
      indices: 1-D int32 array as long as ``values``; ``-1`` or in ``[0, dense.size)``.

    Returns:
      The updated ``dense``.

    Example:
      >>> import jax.numpy as jnp, jax_sparse_sync as jss
      >>> jss.scatter_add(jnp.zeros(4), jnp.array([1., 2., 5.]), jnp.array([3, 3, -1], jnp.int32)).tolist()
      [0.0, 0.0, 0.0, 3.0]
    """
    dense, indices = _check_dense_update(dense, indices, "scatter_add", "dense")
    values = jnp.asarray(values)
    if values.dtype != dense.dtype or values.shape != indices.shape:
        raise TypeError(f"jax_sparse_sync.scatter_add: `values` must be {dense.dtype} of shape "
                        f"{indices.shape} (dense's dtype, one per index); got "
                        f"{values.dtype}{values.shape}. Use `values.astype(dense.dtype)`.")
    call = jax.ffi.ffi_call("jss_scatter_add", jax.ShapeDtypeStruct(dense.shape, dense.dtype),
                            vmap_method="sequential", input_output_aliases={0: 0})
    return call(dense, values, indices)
