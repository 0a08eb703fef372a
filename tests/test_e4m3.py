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


# encode (on the floats' bits, chunked) against encode_reference (the definition, through log2): the same codes for
# every input, float32 and float64

def _same_codes(x):
    got, want = e4m3.encode(x), e4m3.encode_reference(x)
    assert got.dtype == np.uint8 and got.shape == want.shape == np.shape(x)
    bad = np.flatnonzero(got != want)
    first = bad[:5]
    assert bad.size == 0, f"{bad.size} differ, first {np.ravel(x)[first]}: {got.ravel()[first]} != {want.ravel()[first]}"
    return got


def _finite_grid():
    v = e4m3.VALUES[np.isfinite(e4m3.VALUES)].astype(np.float64)
    return np.unique(np.concatenate([v, [480.0]]))  # 480: the first value past 448 (ties at 464 saturate)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_encode_matches_the_reference_on_every_value_and_its_neighbours(dtype):
    v = e4m3.VALUES.astype(dtype)
    ups, downs = np.nextafter(v, dtype(np.inf)), np.nextafter(v, dtype(-np.inf))
    v32 = e4m3.VALUES  # float32 neighbours as float64 too
    n32 = np.concatenate([np.nextafter(v32, np.float32(np.inf)), np.nextafter(v32, np.float32(-np.inf))])
    _same_codes(np.concatenate([v, ups, downs, n32.astype(dtype)]))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_encode_matches_the_reference_on_every_tie_and_around_it(dtype):
    g = _finite_grid()
    mids = np.concatenate([(g[:-1] + g[1:]) / 2, [464.0, -464.0, 472.0]])  # exact in both types
    assert 2.0 ** -10 in mids and 7.5 * 2.0 ** -9 in mids and 15.5 in mids
    m = mids.astype(dtype)
    codes = _same_codes(m)
    assert np.all(codes[np.abs(m) < 448] & 1 == 0), "a tie goes to the even code"
    for direction in (np.inf, -np.inf):
        _same_codes(np.nextafter(m, dtype(direction)))
        _same_codes(np.nextafter(np.nextafter(m, dtype(direction)), dtype(direction)))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.filterwarnings("ignore:invalid value encountered in cast")  # the reference casts a float32 sNaN
def test_encode_matches_the_reference_on_zeros_nans_infinities_and_extremes(dtype):
    info = np.finfo(dtype)
    u = np.uint32 if dtype == np.float32 else np.uint64
    quiet, signalling = (0x7FC00000, 0x7F800001) if dtype == np.float32 else (0x7FF8000000000000, 0x7FF0000000000001)
    nans = np.array([quiet, signalling, quiet | 0x1234, quiet | (1 << (info.bits - 1))], u).view(dtype)
    special = np.concatenate([np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan], dtype), nans,
                              np.array([info.max, -info.max, info.tiny, -info.tiny, info.smallest_subnormal,
                                        -info.smallest_subnormal, 1e30, 2.0 ** -10, 2.0 ** -20, 449.0, 463.9, 464.1,
                                        1e6], dtype)])
    assert special[7].view(u) == signalling, "a signalling NaN reaches encode as it is"
    codes = _same_codes(special)
    assert list(codes[:6]) == [0x00, 0x80, 0x7E, 0xFE, 0x7F, 0xFF]
    assert np.all(codes[6:10] & 0x7F == 0x7F)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_encode_matches_the_reference_on_millions_of_random_values(dtype):
    rng = np.random.default_rng(7)
    n = 2_000_000
    x = rng.uniform(1, 2, n) * 2.0 ** rng.integers(-20, 21, n) * rng.choice([-1.0, 1.0], n)
    _same_codes(x.astype(dtype))
    _same_codes((rng.standard_normal(n) * 0.01).astype(dtype))  # weights / s_w-like, many subnormals


@pytest.mark.parametrize("x", [np.zeros(0, np.float32), np.zeros((3, 0)), np.float32(1.0625), np.float64(-15.5), 3.0,
                               -0.0, np.array(np.nan), [[1, 2], [3, 400]], np.arange(-30, 30, dtype=np.int16),
                               np.float16([0.3, -2.5e-3]), np.linspace(-500, 500, 2 * 3 * 4 * 5).reshape(2, 3, 4, 5),
                               np.linspace(-9, 9, 60).reshape(6, 10)[::2, 1::3].T,
                               np.linspace(-9, 9, 60, dtype=np.float32).reshape(6, 10)[:, ::-2]])
def test_encode_keeps_shapes_types_and_views(x):
    _same_codes(x)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_encode_is_the_same_across_chunk_boundaries(monkeypatch, dtype):
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(10_001) * 2.0 ** rng.integers(-12, 10, 10_001)).astype(dtype)
    x[[5, 6, 999, 1000, 4097]] = [np.nan, -np.inf, 464, -np.nan, -0.0]
    want = e4m3.encode_reference(x)
    for chunk in (7, 1000, 4096, 1 << 17):  # NaN in some chunks only, a last partial chunk, one chunk
        monkeypatch.setattr(e4m3, "CHUNK", chunk)
        np.testing.assert_array_equal(e4m3.encode(x), want)
    big = np.tile(x, (e4m3.CHUNK * 2 + 5) // len(x) + 1)  # longer than two default chunks
    monkeypatch.setattr(e4m3, "CHUNK", 1 << 17)
    np.testing.assert_array_equal(e4m3.encode(big), np.tile(want, len(big) // len(x)))


def _quantise_weights_reference(weight):
    from vggserve.ops.eightbit import weight_scales

    w = np.asarray(weight, dtype=np.float32)
    s = weight_scales(w)
    q = w.astype(np.float64) / s.astype(np.float64).reshape((-1,) + (1,) * (w.ndim - 1))
    return e4m3.encode_reference(q), s


@pytest.mark.parametrize("shape", [(37, 1000), (64, 3, 3, 3), (5, 7)])
@pytest.mark.parametrize("chunk", [1 << 17, 999])
def test_quantise_weights_matches_the_whole_matrix_reference(monkeypatch, shape, chunk):
    from vggserve.ops.eightbit import quantise_weights

    monkeypatch.setattr(e4m3, "CHUNK", chunk)  # 999: row blocks of one or a few rows, a partial last block
    rng = np.random.default_rng(sum(shape))
    w = (rng.standard_normal(shape) * 0.02).astype(np.float32)
    w[1] = 0  # an all-zero channel: s_w = 1
    g = _finite_grid()
    mids = ((g[:-1] + g[1:]) / 2)[(g[:-1] > -448) & (g[1:] < 448)]
    row = np.resize(np.concatenate([[448.0], mids]), w[2].size) * 0.125  # amax 56: s_w 1/8, every quotient a tie
    w[2] = row.reshape(w[2].shape)
    codes, s = quantise_weights(w)
    want, want_s = _quantise_weights_reference(w)
    assert codes.dtype == np.uint8 and codes.shape == w.shape
    np.testing.assert_array_equal(s, want_s)
    np.testing.assert_array_equal(codes, want)
    assert s[1] == 1 and not codes[1].any() and s[2] == np.float32(0.125)


def test_an_encoder_reuses_its_scratch_without_carrying_values_over():
    rng = np.random.default_rng(9)
    encoder = e4m3.Encoder(np.float64, chunk=1000)
    for n in (2500, 7, 1000, 0, 1001):  # longer than its chunk, shorter, exact, empty, one past
        x = rng.standard_normal(n) * 2.0 ** rng.integers(-12, 10, n)
        x[::97] = np.nan
        out = np.full(n, 0x55, np.uint8)
        encoder.into(x, out)
        np.testing.assert_array_equal(out, e4m3.encode_reference(x))


@pytest.mark.parametrize("dtype", [np.float16, np.int32, np.complex64])
def test_an_encoder_takes_only_float32_or_float64(dtype):
    with pytest.raises(ValueError, match="float32 or float64"):
        e4m3.Encoder(dtype)
