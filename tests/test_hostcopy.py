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


def images(count: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (int(rng.integers(1, 400)), int(rng.integers(1, 500)), 3), dtype=np.uint8)
            for _ in range(count)]


@pytest.mark.parametrize("count", [0, 1, 2, 3, 7, 32])
def test_copy_many_packs_images_as_copyto_does(count, monkeypatch):
    monkeypatch.setattr(hostcopy, "MIN_SPLIT", 1)  # deal even the small ones over the threads
    monkeypatch.setattr(hostcopy, "MIN_PAIR", 1)
    srcs = images(count, count)
    packed = np.full(sum(x.nbytes for x in srcs) + 5, 9, np.uint8)
    offsets = np.cumsum([0] + [x.nbytes for x in srcs])
    hostcopy.copy_many([(packed[a:a + x.nbytes], x.reshape(-1)) for a, x in zip(offsets, srcs)])
    want = np.concatenate([x.reshape(-1) for x in srcs] + [np.full(5, 9, np.uint8)])
    np.testing.assert_array_equal(packed, want)


def test_copy_many_deals_a_large_batch_over_the_threads_in_order(monkeypatch):
    """Each copying thread gets consecutive pairs, every pair exactly once, and no run is empty."""
    dealt = []

    class Recording:
        def map(self, fn, runs):
            runs = list(runs)
            dealt.extend(runs)
            return map(fn, runs)

    monkeypatch.setattr(hostcopy, "_executor", Recording)
    monkeypatch.setattr(hostcopy, "_threads", lambda: 3)
    srcs = [np.full((375, 500, 3), i, np.uint8) for i in range(32)]  # 18 MB of photos
    dsts = [np.empty_like(x) for x in srcs]
    hostcopy.copy_many(list(zip(dsts, srcs)))
    assert len(dealt) == 3 and all(dealt)
    assert [id(dst) for run in dealt for dst, _ in run] == [id(d) for d in dsts]
    assert all((d == i).all() for i, d in enumerate(dsts))


def test_copy_many_of_a_small_batch_stays_on_the_calling_thread(monkeypatch):
    monkeypatch.setattr(hostcopy, "_executor", lambda: pytest.fail("a small copy went to the threads"))
    srcs = images(3)
    dsts = [np.empty_like(x) for x in srcs]
    hostcopy.copy_many(list(zip(dsts, srcs)))
    assert all(np.array_equal(d, s) for d, s in zip(dsts, srcs))


def test_copy_many_of_many_small_pieces_stays_on_the_calling_thread_however_large_in_all(monkeypatch):
    """A batch's compressed JPEGs (64 x 66 KB, past MIN_SPLIT in all): each copy would take the GIL back on a
    copying thread, so they are copied here."""
    monkeypatch.setattr(hostcopy, "_executor", lambda: pytest.fail("small pieces went to the threads"))
    monkeypatch.setattr(hostcopy, "_threads", lambda: 4)
    srcs = [np.full(66_586, i, np.uint8) for i in range(64)]
    assert sum(x.nbytes for x in srcs) >= hostcopy.MIN_SPLIT
    out = np.zeros(66_586 * 64 + 3, np.uint8)
    hostcopy.copy_many([(out[i * 66_586:(i + 1) * 66_586], x) for i, x in enumerate(srcs)])
    np.testing.assert_array_equal(out[:-3], np.repeat(np.arange(64, dtype=np.uint8), 66_586))
    assert not out[-3:].any()
