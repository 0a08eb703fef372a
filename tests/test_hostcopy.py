"""runtime/hostcopy.py: large copies into staging split over threads give exactly np.copyto's result."""

import numpy as np
import pytest

from vggserve.runtime import hostcopy


@pytest.mark.parametrize("shape,dtype", [((64, 3, 224, 224), np.float32), ((7, 224, 224, 3), np.uint8),
                                         ((1, 3, 224, 224), np.float32), ((5_000_001,), np.float32), ((3,), np.uint8)])
def test_copy_into_equals_copyto(shape, dtype, monkeypatch):
    monkeypatch.setattr(hostcopy, "MIN_SPLIT", 1)  # split even the small ones
    rng = np.random.default_rng(0)
    src = (rng.standard_normal(shape) * 100).astype(dtype)
    dst = np.zeros(shape, dtype)
    hostcopy.copy_into(dst, src)
    np.testing.assert_array_equal(dst, src)


def test_copy_into_casts_like_copyto():
    src = np.arange(6 << 20, dtype=np.float64).reshape(6, -1)
    dst = np.empty(src.shape, np.float32)
    hostcopy.copy_into(dst, src)
    np.testing.assert_array_equal(dst, src.astype(np.float32))


def test_copy_into_a_view_of_a_larger_buffer_leaves_the_rest():
    host = np.full((8, 1 << 20), 7, np.float32)
    src = np.ones((5, 1 << 20), np.float32)
    hostcopy.copy_into(host[:5], src)
    assert (host[:5] == 1).all() and (host[5:] == 7).all()
