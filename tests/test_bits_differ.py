"""reference.bits_differ: the GPU-against-CPU comparison, bit for bit but NaN as NaN."""

import ml_dtypes
import numpy as np
import pytest
from reference import bits_differ


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16, np.float64])
def test_nan_payloads_are_equal_and_everything_else_is_bits(dtype):
    a = np.array([0.0, 1.5, np.nan, -0.0, np.inf, 2.0], dtype)
    b = a.copy()
    assert bits_differ(a, b).size == 0
    width = {2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
    gpu_nan = np.array(np.iinfo(width).max >> 1, width).view(dtype)  # a GPU's canonical NaN
    assert np.isnan(gpu_nan.astype(np.float64)) and gpu_nan.view(width) != a[2:3].view(width)
    b[2] = gpu_nan
    assert bits_differ(a, b).size == 0
    b[3] = 0.0  # -0.0 against +0.0: equal as numbers, not as bits
    b[5] = np.nan  # a NaN on one side only
    assert bits_differ(a, b).tolist() == [3, 5]


def test_integers_and_shapes():
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    b = a.copy()
    b[1, 2] = 7
    assert bits_differ(a, b).tolist() == [5]
    with pytest.raises(ValueError, match="int32"):
        bits_differ(a, a.astype(np.int64))
