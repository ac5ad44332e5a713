"""The selection kernels at N = 2^31 - 1 (the largest int32-indexable size).

One check shared by the CPU test (tests/test_kernels.py) and the GPU test
(tests/test_cuda_kernels.py): entries planted near the end of 2^31 - 1 zeros,
whose byte offsets are past 2^31, must be found with their exact indices.
bfloat16 keeps the input at 4 GiB.
"""

import jax
import ml_dtypes
import numpy as np

import jax_sparse_sync as jss
from jax_sparse_sync.bindings.block_scan import block_scan


def check_planted_entries(n, device):
    """Entries planted near the end of n zeros are found with their exact indices."""
    planted = np.array([5, n - 4096, n - 99, n - 1], dtype=np.int32)
    # built on the host: np.zeros leaves its pages untouched (an XLA scatter
    # into jnp.zeros would hold two more n-sized buffers at its peak)
    host = np.zeros(n, ml_dtypes.bfloat16)
    host[planted] = np.array([1.0, -3.0, 2.0, -4.0], ml_dtypes.bfloat16)
    x = jax.device_put(host, device)
    del host
    values, indices = jss.topk(x, 4)
    np.testing.assert_array_equal(np.asarray(indices), planted)
    np.testing.assert_array_equal(np.asarray(values, np.float32), [1.0, -3.0, 2.0, -4.0])
    values, indices, count = jss.threshold_select(x, 1.5, 8)
    assert int(count) == 3
    np.testing.assert_array_equal(np.asarray(indices), list(planted[1:]) + [-1] * 5)
    assert float(jss.kth_magnitude(x, 2)) == 3.0
    # the largest of each bucket (n - 99 and n - 1 share the last, partial one)
    _, bucket_indices = jss.bucket_topk(x, 1, 512)
    winners = planted[[0, 1, 3]]
    np.testing.assert_array_equal(np.asarray(bucket_indices)[winners // 512], winners)
    mask = np.asarray(block_scan(x, 4096))
    np.testing.assert_array_equal(np.flatnonzero(mask), np.unique(planted // 4096))


def available_memory_bytes() -> int:
    """MemAvailable from /proc/meminfo (0 where there is none)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
