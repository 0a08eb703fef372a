"""E4M3 numerics (vggserve/quant/e4m3.py): the reference the FP8 kernels, scales and calibration are tested against."""

import numpy as np
import pytest

from vggserve.quant import e4m3


def test_every_code_decodes_to_the_value_the_format_defines():
    v = e4m3.VALUES
    assert v[0x00] == 0 and np.signbit(v[0x80]) and v[0x80] == 0
    assert v[0x01] == 2.0 ** -9 and v[0x07] == 7 * 2.0 ** -9  # subnormals
    assert v[0x08] == 2.0 ** -6 and v[0x38] == 1.0 and v[0x39] == 1.125
    assert v[0x7E] == 448 and v[0xFE] == -448
    assert np.isnan(v[0x7F]) and np.isnan(v[0xFF])
    finite = v[np.isfinite(v)]
    assert len(finite) == 254 and len(np.unique(finite)) == 253  # +0 and -0 compare equal


def test_every_finite_code_encodes_back_to_itself():
    codes = np.array([c for c in range(256) if c not in (0x7F, 0xFF)], np.uint8)
    assert np.array_equal(e4m3.encode(e4m3.decode(codes)), codes)


def test_rounding_is_to_nearest_with_ties_to_even_against_a_brute_force_search():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal(20000) * s for s in (1e-3, 0.05, 1.0, 30.0, 300.0)]).astype(np.float32)
    finite = e4m3.VALUES[np.isfinite(e4m3.VALUES)].astype(np.float64)
    grid = np.unique(finite)
    xs = np.clip(x.astype(np.float64), -448, 448)
    idx = np.abs(xs[:, None] - grid[None, :]).argmin(axis=1)
    want = grid[idx]
    got = e4m3.round_trip(x).astype(np.float64)
    # equal, except exact ties, which argmin breaks to the lower value and the format to the even mantissa
    diff = got != want
    assert np.all(np.abs(np.abs(xs[diff] - got[diff]) - np.abs(xs[diff] - want[diff])) == 0)


@pytest.mark.parametrize("x, want", [(1.0625, 1.0), (1.1875, 1.25), (15.5, 16.0), (17.0, 16.0), (19.0, 20.0),
                                     (2.0 ** -10, 0.0), (3 * 2.0 ** -10, 2 * 2.0 ** -9), (464.0, 448.0),
                                     (1e9, 448.0), (-1e9, -448.0), (np.inf, 448.0), (-np.inf, -448.0)])
def test_ties_go_to_even_and_large_values_saturate(x, want):
    assert e4m3.round_trip(np.float32(x)) == want


def test_nan_stays_nan():
    assert np.isnan(e4m3.round_trip(np.float32(np.nan)))
