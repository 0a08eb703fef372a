"""ops/resize.py and kernels/resize.cl against Pillow, bit for bit: the numpy tables reference on a few hundred
sizes, the OpenCL passes on a mixed batch in one enqueue and on awkward single images, and crop_plan's None cases."""

import numpy as np
import pyopencl as cl
import pytest
from PIL import Image

from vggserve.ops import resize as rs
from vggserve.ops.resize import DeviceResize, crop_plan, crop_tables, resize_crop_numpy, resize_numpy
from vggserve.preprocess import center_crop, crop_pixels, limit_aspect_ratio, resize_shorter, resized_size
from vggserve.runtime import devices as devs
from vggserve.runtime.programs import ProgramCache

MF = cl.mem_flags
C = 224
POISON = 0x5A  # what the output buffer holds before a call: a crop the kernels never write keeps it


def pillow_crop(pixels):
    return np.asarray(center_crop(Image.fromarray(pixels)))


def random_pixels(rng, width, height):
    return rng.integers(0, 256, (height, width, 3), dtype=np.uint8)


def reference_sizes(rng):
    """(width, height) pairs: the named cases, then random ones of each kind (>= 200 in all)."""
    named = [(500, 375), (375, 500), (1024, 768), (768, 1024), (4000, 3000), (512, 512), (512, 1024), (230, 300),
             (100, 150), (20, 30), (1, 1), (2, 1), (1, 64), (3, 1000), (257, 257), (257, 256), (256, 257),
             (225, 4000), (4000, 225), (300, 10000), (10000, 300), (300, 1000), (1000, 300), (50, 5000),
             (255, 255), (256, 256), (511, 255), (513, 257), (1601, 1201)]
    sizes = list(named)
    for _ in range(90):  # downscale, both sides over 256
        sizes.append(tuple(int(v) for v in rng.integers(257, 1400, 2)))
    for _ in range(45):  # upscale: shorter side under 256
        short = int(rng.integers(1, 256))
        long = int(rng.integers(short, min(64 * short, 1200) + 1))
        sizes.append((short, long) if rng.random() < 0.5 else (long, short))
    for _ in range(40):  # tall and wide, up to and past 64:1 (limit_aspect_ratio crops those)
        short = int(rng.integers(4, 120))
        long = int(short * rng.uniform(4, 80))
        sizes.append((short, long) if rng.random() < 0.5 else (long, short))
    return sizes


def test_numpy_reference_equals_pillow_center_crop():
    rng = np.random.default_rng(7)
    sizes = reference_sizes(rng)
    assert len(sizes) >= 200
    orders = set()
    for width, height in sizes:
        pixels = random_pixels(rng, width, height)
        got = resize_crop_numpy(pixels)
        assert got.dtype == np.uint8 and got.shape == (C, C, 3) and got.flags.c_contiguous
        assert np.array_equal(got, pillow_crop(pixels)), (width, height)
        limited = limit_aspect_ratio(Image.new("RGB", (width, height)))
        tables = crop_tables(*limited.size)
        if tables is not None:
            orders.add(tables.horizontal_first)
    assert orders == ({True, False} if rs.VERTICAL_FIRST_RULE else {True})  # both of Pillow's pass orders ran


def test_numpy_resize_equals_pillow_any_size():
    """The passes alone on arbitrary resizes: up, down, mixed, one axis unchanged (a pass Pillow skips), both pass
    orders (Pillow 13 runs the vertical pass first when the height shrinks by over twice the width's pixels)."""
    rng = np.random.default_rng(11)
    cases = [(300, 1000, 280, 500), (300, 1000, 300, 500), (300, 1000, 150, 1000), (40, 40, 40, 40),
             (10, 300, 10, 3), (300, 10, 3, 10), (7, 9, 300, 2)]
    for _ in range(120):
        w, h, ow, oh = (int(v) for v in rng.integers(1, 420, 4))
        r = rng.random()
        ow, oh = (w if r < 0.2 else ow), (h if 0.2 <= r < 0.4 else oh)
        cases.append((w, h, ow, oh))
    for w, h, ow, oh in cases:
        pixels = random_pixels(rng, w, h)
        want = np.asarray(Image.fromarray(pixels).resize((ow, oh), Image.BILINEAR))
        assert np.array_equal(resize_numpy(pixels, ow, oh), want), (w, h, ow, oh)


def test_crop_plan_none_exactly_where_the_cpu_path_must_crop():
    for width in range(1, 700, 3):
        for height in (1, 2, 100, 255, 256, 257, 300, 700, 5000):
            plan = crop_plan(width, height)
            limited = max(width, height) <= 64 * min(width, height)
            assert (plan is None) == (not limited or min(width, height) == 256), (width, height)
            if plan is not None:
                rw, rh = resized_size(width, height)
                assert (plan.resized_width, plan.resized_height) == (rw, rh) != (width, height)
                assert (plan.top, plan.left) == (int(round((rh - C) / 2.0)), int(round((rw - C) / 2.0)))
    assert crop_plan(256, 256) is None and crop_plan(256, 1000) is None and crop_plan(900, 256) is None
    assert crop_plan(0, 10) is None and crop_plan(10, 0) is None
    assert crop_plan(10, 641) is None  # past 64:1: center_crop crops it first, so this size is never resized
    # torchvision pads a resized side shorter than the crop: never at Resize(256) / CenterCrop(224), so a smaller
    # resize shows the rule (and the numpy path pads as crop_pixels does)
    assert crop_plan(300, 400, shorter=200) is None and crop_plan(300, 400, shorter=224) is not None
    rng = np.random.default_rng(3)
    for width, height in [(300, 400), (50, 30), (224, 500)]:
        pixels = random_pixels(rng, width, height)
        want = crop_pixels(resize_shorter(Image.fromarray(pixels), 200), C)
        assert np.array_equal(resize_crop_numpy(pixels, shorter=200), want), (width, height)


def test_tables_are_cached_and_read_only():
    a, b = crop_tables(500, 375), crop_tables(500, 375)
    assert a is b and crop_tables(256, 300) is None
    with pytest.raises(ValueError):
        a.block[0] = 1


@pytest.fixture(scope="module")
def cl_base(test_device):
    info = devs.resolve(test_device)
    device = devs.cl_device(info)
    ctx = cl.Context([device])
    cache = ProgramCache(ctx, device)
    return ctx, cl.CommandQueue(ctx), cache, cache.build("resize.cl", {})


@pytest.fixture(scope="module", params=rs.VARIANTS)
def cl_env(cl_base, request):
    """Each device test runs on both of resize.cl's kernel pairs (the same bytes)."""
    ctx, queue, _, program = cl_base
    return ctx, queue, DeviceResize(ctx, program, variant=request.param), program


def run_device(cl_env, images, indices, slots, op=None, wait_for=None):
    """Pack `images` back to back (after a few unused bytes), resize them into `slots` poisoned crops at
    `indices` in one enqueue; returns the crops as read back."""
    ctx, queue, default_op, _ = cl_env
    op = op or default_op
    raw, placed, offset = [np.zeros(5, np.uint8)], [], 5
    for pixels, index in zip(images, indices):
        height, width = pixels.shape[:2]
        placed.append((offset, width, height, index))
        raw.append(pixels.reshape(-1))
        offset += pixels.size
    raw_buf = cl.Buffer(ctx, MF.READ_ONLY | MF.COPY_HOST_PTR, hostbuf=np.concatenate(raw))
    out = cl.Buffer(ctx, MF.READ_WRITE, slots * C * C * 3)
    cl.enqueue_copy(queue, out, np.full(slots * C * C * 3, POISON, np.uint8))
    event = op.enqueue(queue, raw_buf, placed, out, wait_for=wait_for)
    host = np.empty((slots, C, C, 3), np.uint8)
    cl.enqueue_copy(queue, host, out, wait_for=[event])
    return host


def test_device_batch_of_mixed_sizes_in_one_enqueue(cl_env):
    rng = np.random.default_rng(5)
    sizes = [(500, 375), (375, 500), (1024, 768), (640, 480), (257, 257), (257, 300), (300, 1000), (300, 10000),
             (225, 4000), (4000, 225), (20, 30), (100, 150), (1, 1), (1, 64), (512, 512), (1200, 257), (333, 777),
             (999, 1001), (230, 300), (640, 480), (500, 375)]
    images = [random_pixels(rng, w, h) for w, h in sizes]
    slots = len(images) + 4
    indices = rng.permutation(slots)[:len(images)]
    out = run_device(cl_env, images, indices, slots)
    for pixels, index, size in zip(images, indices, sizes):
        assert np.array_equal(out[index], pillow_crop(pixels)), size
    for free in set(range(slots)) - set(indices.tolist()):
        assert (out[free] == POISON).all()  # slots for crops that do not come from raw are left alone


@pytest.mark.parametrize("size", [(257, 257), (257, 256 * 3), (256 * 3, 257), (225, 4000), (4000, 225), (1, 1),
                                  (3, 192), (255, 255), (511, 513), (300, 10000), (1000, 300), (2000, 1500)],
                         ids=lambda s: f"{s[0]}x{s[1]}")
def test_device_single_awkward_sizes(cl_env, size):
    rng = np.random.default_rng(size[0] * 7919 + size[1])
    pixels = random_pixels(rng, *size)
    out = run_device(cl_env, [pixels], [1], 2)
    assert np.array_equal(out[1], pillow_crop(pixels))
    assert (out[0] == POISON).all()


def test_device_reuse_grows_scratch_and_waits(cl_env):
    """A fresh op run twice: a small batch, then one needing a larger scratch and table; then an empty call."""
    ctx, queue, _, program = cl_env
    op = DeviceResize(ctx, program, variant=cl_env[2].variant)
    rng = np.random.default_rng(9)
    small = [random_pixels(rng, 300, 260)]
    big = [random_pixels(rng, w, h) for w, h in [(1600, 1200), (260, 3000), (700, 500)]]
    marker = cl.enqueue_marker(queue)
    out = run_device(cl_env, small, [0], 1, op=op, wait_for=[marker])
    assert np.array_equal(out[0], pillow_crop(small[0]))
    first_scratch = op._scratch_bytes
    out = run_device(cl_env, big, [2, 0, 1], 3, op=op)
    assert op._scratch_bytes > first_scratch
    for i, pixels in zip([2, 0, 1], big):
        assert np.array_equal(out[i], pillow_crop(pixels))
    raw = cl.Buffer(ctx, MF.READ_ONLY, 16)
    out_buf = cl.Buffer(ctx, MF.READ_WRITE, C * C * 3)
    op.enqueue(queue, raw, [], out_buf).wait()  # nothing to do: a marker


def test_device_rejects_what_it_cannot_do(cl_env):
    ctx, queue, op, _ = cl_env
    raw = cl.Buffer(ctx, MF.READ_ONLY, 500 * 375 * 3)
    out = cl.Buffer(ctx, MF.READ_WRITE, 2 * C * C * 3)
    with pytest.raises(ValueError, match="crop_plan is None"):
        op.enqueue(queue, raw, [(0, 256, 300, 0)], out)
    with pytest.raises(ValueError, match="outside the raw buffer"):
        op.enqueue(queue, raw, [(3, 500, 375, 0)], out)
    with pytest.raises(ValueError, match="output index"):
        op.enqueue(queue, raw, [(0, 500, 375, 2)], out)


def test_pack_layout_and_large_offsets(cl_env):
    op = cl_env[2]
    offset = (5 << 32) + 0x89ABCDEF  # past 4 GiB: low half wraps in int32, the kernel rebuilds it unsigned
    table, pixels, tiles = op.pack([(offset, 500, 375, 3), (7, 500, 375, 1), (11, 300, 10000, 0)])
    d = table[:3 * rs.DESC].reshape(3, rs.DESC)
    assert (int(d[0, 0]) & 0xFFFFFFFF) | (int(d[0, 1]) << 32) == offset
    t, tall = crop_tables(500, 375), crop_tables(300, 10000)
    assert d[0, 9] == d[1, 9] == 3 * rs.DESC  # one coefficient block per distinct size
    assert d[2, 9] == 3 * rs.DESC + t.block.size
    tall_order = 1 if rs.VERTICAL_FIRST_RULE else 0  # Pillow 13+ runs this one's vertical pass first
    assert list(d[:, 3]) == [0, 0, tall_order] and list(d[:, 13]) == [3, 1, 0]
    assert list(d[:, 4]) == [0, t.scratch_rows * C, 2 * t.scratch_rows * C]
    tall_cols = tall.scratch_cols
    if op.variant == "quad":  # scratch rows padded to 4 pixels; each image's first tile of RS_RB x 4 RS_QX pixels
        tall_cols = -(-tall_cols // 4) * 4
        assert list(d[:, 15]) == [C, C, tall_cols]
        per = -(-t.scratch_rows // op.rb) * -(-C // (4 * op.qx))
        assert list(d[:, 14]) == [0, per, 2 * per]
        assert tiles == 2 * per + -(-tall.scratch_rows // op.rb) * -(-tall_cols // (4 * op.qx))
    else:
        assert tiles == 0 and not d[:, 14:].any()
    assert pixels == 2 * t.scratch_rows * C + tall.scratch_rows * tall_cols
    assert table.size == 3 * rs.DESC + t.block.size + tall.block.size


def test_quad_variant_pads_scratch_rows_that_are_not_whole_quads(cl_env, monkeypatch):
    """Images whose pass 1 (vertical first) writes scratch rows of a width that is not a multiple of 4 pixels, in
    one batch with others: the quad straddling the row's end reads no pixel past it and the crops stay exact.
    Pillow before 13 never runs the vertical pass first: with it installed (the GPU host's) the rule is forced and
    the crops are held to the numpy reference of the same tables (test_numpy_reference_equals_pillow holds that one
    to Pillow 13+), with Pillow 13+ to Pillow itself."""
    native = rs.VERTICAL_FIRST_RULE
    monkeypatch.setattr(rs, "VERTICAL_FIRST_RULE", True)
    rs.crop_tables.cache_clear()
    try:
        sizes = [(300, 10000), (301, 10001), (259, 2000), (500, 375), (262, 3001)]
        tables = [crop_tables(w, h) for w, h in sizes]
        assert {t.scratch_cols % 4 for t in tables} - {0}  # the case this test is for
        assert not tables[0].horizontal_first and tables[3].horizontal_first  # both orders in the batch
        rng = np.random.default_rng(31)
        images = [random_pixels(rng, w, h) for w, h in sizes]
        out = run_device(cl_env, images, list(range(len(images))), len(images))
        for pixels, index, size in zip(images, range(len(images)), sizes):
            want = pillow_crop(pixels) if native else rs.resize_crop_numpy(pixels)
            assert np.array_equal(out[index], want), size
    finally:
        monkeypatch.undo()
        rs.crop_tables.cache_clear()


def test_quad_tiles_larger_than_the_crop_and_its_sources(cl_base):
    """resize.cl built with a work-group tile of 256 x 16 pixels (wider than the 224 crop, taller than the scratch of
    small sources): the tiles' parts past an image's end write nothing, whatever the batch's mix."""
    ctx, queue, cache, _ = cl_base
    params = {"RS_QX": 64, "RS_RB": 16}
    op = DeviceResize(ctx, cache.build("resize.cl", params), params)
    rng = np.random.default_rng(37)
    sizes = [(1, 1), (20, 30), (3, 192), (500, 375), (300, 10000), (2, 1), (257, 257)]
    images = [random_pixels(rng, w, h) for w, h in sizes]
    out = run_device((ctx, queue, op, None), images, [6, 5, 4, 3, 2, 1, 0], 8)
    for pixels, index, size in zip(images, [6, 5, 4, 3, 2, 1, 0], sizes):
        assert np.array_equal(out[index], pillow_crop(pixels)), size
    assert (out[7] == POISON).all()


def test_unknown_resize_variant_is_refused_with_the_known_ones(cl_base):
    ctx, _, _, program = cl_base
    with pytest.raises(ValueError, match="not one of item, quad"):
        DeviceResize(ctx, program, variant="fast")


def test_place_images_packs_back_to_back_in_the_given_order():
    images = [(3, np.zeros((375, 500, 3), np.uint8)), (0, np.zeros((97, 231, 3), np.uint8))]
    placed, total = rs.place_images(images)
    assert placed == [(0, 500, 375, 3), (375 * 500 * 3, 231, 97, 0)]
    assert total == (375 * 500 + 97 * 231) * 3
    assert rs.place_images([]) == ([], 0)
