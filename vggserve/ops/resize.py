"""Resize(256) + CenterCrop(224) on the device, bit for bit as `preprocessing.center_crop` (Pillow BILINEAR).

Pillow's resampling (src/libImaging/Resample.c) is exact integer arithmetic once its coefficients are known: per
output index, a window of source indices [xmin, xmin + taps) and float64 weights, normalised by their sum and
turned into fixed point with 22 fraction bits (rounded half away from zero); each pass computes
clip8((2^21 + sum(pixel * coeff)) >> 22) on 8-bit data. Pillow runs two passes, a pass being skipped when its axis
keeps its size: the horizontal one first (on the source rows the vertical pass reads), or, from Pillow 13 on, the
vertical one first when the height shrinks by more than twice as many pixels as the width (`horizontal_first`).
The order matters: the intermediate image is rounded to 8 bits. Here the host computes the same coefficients, in
the same float64 operation order, for the crop's 224 columns and 224 rows only (an output depends on its own
coefficients alone), and `kernels/resize.cl` runs the two integer passes in Pillow's order, the first only on the
source lines the second reads: the same bytes as Pillow's resize followed by the crop.

`crop_plan(w, h)` says whether (and how) the device path applies to an aspect-limited RGB image of that size;
`crop_tables(w, h)` are its cached tables; `DeviceResize.enqueue` resizes and crops a batch of raw images in one
launch per pass; `resize_crop_numpy` / `resize_numpy` are the same arithmetic in numpy (the reference the tests
hold to Pillow, and the documentation of what the device computes).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import PIL
import pyopencl as cl

from ..preprocessing import (CROP_SIZE, MAX_ASPECT_RATIO, RESIZE_SHORTER, aspect_box, crop_offsets, crop_pixels,
                          resized_size)
from .launch import Launch, round_up

PRECISION_BITS = 22  # Pillow's fixed-point fraction bits for 8-bit images: 32 - 8 - 2
ONE = 1 << PRECISION_BITS
HALF = 1 << (PRECISION_BITS - 1)
BILINEAR_SUPPORT = 1.0
DESC = 16  # int32 fields per image in the descriptor table (kernels/resize.cl)
TABLE_CACHE = 1024  # image sizes whose tables are kept on the host


@dataclass(frozen=True)
class CropPlan:
    """The geometry of `center_crop` for an aspect-limited RGB image of width x height that needs a resize."""

    width: int
    height: int
    resized_width: int
    resized_height: int
    top: int  # crop offsets in the resized image
    left: int
    crop: int = CROP_SIZE


def crop_plan(width: int, height: int, shorter: int = RESIZE_SHORTER, crop: int = CROP_SIZE) -> CropPlan | None:
    """`center_crop`'s geometry for an RGB image of this size on which `limit_aspect_ratio` has run, or None where
    the device path does not apply and the CPU path must crop: the size is unchanged by Resize(shorter) (no resize:
    the crop is a slice), the resized image is smaller than `crop` in a side (torchvision pads; never the case for
    256 and 224), or the size is empty or beyond MAX_ASPECT_RATIO (not aspect-limited: `center_crop` would crop it
    first)."""
    if width < 1 or height < 1 or max(width, height) > MAX_ASPECT_RATIO * min(width, height):
        return None
    rw, rh = resized_size(width, height, shorter)
    if (rw, rh) == (width, height) or rw < crop or rh < crop:
        return None
    top, left = crop_offsets(rh, rw, crop)
    return CropPlan(width, height, rw, rh, top, left, crop)


def axis_coeffs(in_size: int, out_size: int, start: int, count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pillow's BILINEAR `precompute_coeffs` + `normalize_coeffs_8bpc` for one axis resized from in_size to out_size
    (the whole source as the box), for outputs start .. start + count - 1 only.

    Returns (first, taps, coeffs): int32 (count,) first source index and number of taps, and int32 (count, K)
    fixed-point coefficients, K the largest tap count, zero past each output's taps.
    """
    # filterscale = scale = (double)(in1 - in0) / outSize, the box (0, in_size) held in C floats
    scale = float(np.float32(in_size) - np.float32(0.0)) / out_size
    filterscale = scale if scale >= 1.0 else 1.0
    support = BILINEAR_SUPPORT * filterscale
    ss = 1.0 / filterscale
    xx = np.arange(start, start + count, dtype=np.float64)
    center = 0.0 + (xx + 0.5) * scale
    xmin = np.trunc(center - support + 0.5).astype(np.int64)  # C's (int) truncates toward zero
    xmin[xmin < 0] = 0
    xmax = np.trunc(center + support + 0.5).astype(np.int64)
    xmax[xmax > in_size] = in_size
    taps = xmax - xmin
    k = int(taps.max())
    j = np.arange(k)
    live = j[None, :] < taps[:, None]
    # filter((x + xmin - center + 0.5) * ss), x + xmin an int
    arg = (((j[None, :] + xmin[:, None]).astype(np.float64) - center[:, None]) + 0.5) * ss
    a = np.abs(arg)
    w = np.where(live & (a < 1.0), 1.0 - a, 0.0)
    ww = np.add.accumulate(w, axis=1)[:, -1]  # sequential sum in tap order (np.sum would pair terms up)
    w = np.divide(w, ww[:, None], out=w.copy(), where=ww[:, None] != 0.0)
    scaled = w * ONE
    fixed = np.where(w < 0, np.trunc(-0.5 + scaled), np.trunc(0.5 + scaled))
    return xmin.astype(np.int32), taps.astype(np.int32), fixed.astype(np.int32)


def identity_coeffs(start: int, count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Tables for an axis that keeps its size (Pillow skips that pass): one tap of weight 1, an exact copy."""
    return (np.arange(start, start + count, dtype=np.int32), np.ones(count, np.int32),
            np.full((count, 1), ONE, np.int32))


def horizontal_first(width: int, height: int, out_width: int, out_height: int) -> bool:
    """Whether Pillow runs the horizontal pass before the vertical one for this resize (8-bit images).

    Pillow 13 (ImagingResampleInner, python-pillow/Pillow#9549) runs the vertical pass first when the height
    shrinks by more than twice as many pixels as the width does, in C int arithmetic; earlier Pillow always runs
    the horizontal pass first.
    """
    if not VERTICAL_FIRST_RULE:
        return True
    dh, dw = height - out_height, width - out_width
    return not (dh > 0 and dh > dw * 2)


def _pillow_major() -> int:
    try:
        return int(PIL.__version__.split(".")[0])
    except ValueError:
        return 0


VERTICAL_FIRST_RULE = _pillow_major() >= 13


@dataclass(frozen=True, eq=False)
class CropTables:
    """Coefficient tables of the crop's outputs (read-only arrays, shared through the cache).

    h_*: per crop column, first = absolute source column; v_*: per crop row, first = absolute source row.
    Pass 1 reads the source and writes scratch_rows x scratch_cols pixels: horizontal first, the source rows
    [base_row, base_row + scratch_rows) (the union of the crop rows' vertical supports) x the crop's columns;
    vertical first, the crop's rows x the source columns [base_col, base_col + scratch_cols). Pass 2 reads that.
    block: int32, the device layout: pass 1's entries [first, taps, coeffs (k1)] (absolute indices), then pass 2's
    entries [first - base, taps, coeffs (k2)] (indices into the scratch image).
    """

    plan: CropPlan
    horizontal_first: bool
    need_horizontal: bool
    need_vertical: bool
    h_first: np.ndarray
    h_taps: np.ndarray
    h_coeffs: np.ndarray
    v_first: np.ndarray
    v_taps: np.ndarray
    v_coeffs: np.ndarray
    base_row: int
    base_col: int
    scratch_rows: int
    scratch_cols: int
    k1: int
    k2: int
    block: np.ndarray

    @property
    def pass1_size(self) -> int:
        """int32s of pass 1's entries at the start of `block` (pass 2's follow)."""
        return (self.h_first.size if self.horizontal_first else self.v_first.size) * (2 + self.k1)


def _entries(first: np.ndarray, taps: np.ndarray, coeffs: np.ndarray) -> np.ndarray:
    return np.column_stack([first, taps, coeffs]).astype(np.int32).ravel()


def _tables(plan: CropPlan, top: int, left: int, ch: int, cw: int) -> CropTables:
    """Tables for outputs [top, top + ch) x [left, left + cw) of the resize `plan` describes."""
    w, h, rw, rh = plan.width, plan.height, plan.resized_width, plan.resized_height
    need_h, need_v = rw != w, rh != h  # ImagingResampleInner's need_horizontal / need_vertical (whole-image box)
    h_first = horizontal_first(w, h, rw, rh)
    hf, ht, hk = axis_coeffs(w, rw, left, cw) if need_h else identity_coeffs(left, cw)
    vf, vt, vk = axis_coeffs(h, rh, top, ch) if need_v else identity_coeffs(top, ch)
    if h_first:
        base_row, base_col = int(vf.min()), 0
        rows, cols = int((vf + vt).max()) - base_row, cw
        block = np.concatenate([_entries(hf, ht, hk), _entries(vf - base_row, vt, vk)])
        k1, k2 = hk.shape[1], vk.shape[1]
    else:
        base_row, base_col = 0, int(hf.min())
        rows, cols = ch, int((hf + ht).max()) - base_col
        block = np.concatenate([_entries(vf, vt, vk), _entries(hf - base_col, ht, hk)])
        k1, k2 = vk.shape[1], hk.shape[1]
    for a in (hf, ht, hk, vf, vt, vk, block):
        a.setflags(write=False)
    return CropTables(plan, h_first, need_h, need_v, hf, ht, hk, vf, vt, vk, base_row, base_col, rows, cols, k1, k2,
                      block)


@lru_cache(maxsize=TABLE_CACHE)
def crop_tables(width: int, height: int, shorter: int = RESIZE_SHORTER, crop: int = CROP_SIZE) -> CropTables | None:
    """The tables of `crop_plan(width, height)`'s crop (None where the plan is None), cached per size."""
    plan = crop_plan(width, height, shorter, crop)
    if plan is None:
        return None
    return _tables(plan, plan.top, plan.left, crop, crop)


def limit_aspect_pixels(pixels: np.ndarray, max_ratio: int = MAX_ASPECT_RATIO) -> np.ndarray:
    """`preprocess.limit_aspect_ratio` on a (h, w, 3) array: the same centre slice (a view)."""
    box = aspect_box(pixels.shape[1], pixels.shape[0], max_ratio)
    return pixels if box is None else pixels[box[1]:box[3], box[0]:box[2]]


def _resample(src: np.ndarray, axis: int, first: np.ndarray, coeffs: np.ndarray) -> np.ndarray:
    """One Pillow 8-bit pass along `axis` (0 rows, 1 columns) of uint8 (h, w, 3) src: output i reads
    src[first[i] + j] along the axis with coeffs[i, j] (zero past its taps, where the index is only kept in range)."""
    lo, hi = int(first.min()), min(int(first.max()) + coeffs.shape[1], src.shape[axis])
    data = (src[lo:hi] if axis == 0 else src[:, lo:hi]).astype(np.int64)  # only the lines some output reads
    first, last = first - lo, hi - lo - 1
    shape = [src.shape[0], src.shape[1], 3]
    shape[axis] = first.size
    acc = np.full(shape, HALF, np.int64)
    for j in range(coeffs.shape[1]):
        k = coeffs[:, j][:, None, None] if axis == 0 else coeffs[:, j][None, :, None]
        acc += np.take(data, np.minimum(first + j, last), axis=axis) * k
    return np.clip(acc >> PRECISION_BITS, 0, 255).astype(np.uint8)


def _passes(pixels: np.ndarray, t: CropTables) -> np.ndarray:
    """Pillow's passes, in Pillow's order, on the tables' outputs: uint8 (crop rows, crop columns, 3)."""
    hf, vf = t.h_first, t.v_first
    if t.horizontal_first:
        band = pixels[t.base_row:t.base_row + t.scratch_rows]
        if t.need_horizontal:
            tmp = _resample(band, 1, hf, t.h_coeffs)
        else:  # the vertical pass reads the source itself
            tmp = band[:, hf[0]:hf[0] + hf.size]
        rel = vf - t.base_row
        if not t.need_vertical:
            return np.ascontiguousarray(tmp[rel[0]:rel[0] + rel.size])
        return _resample(tmp, 0, rel, t.v_coeffs)
    band = pixels[:, t.base_col:t.base_col + t.scratch_cols]
    tmp = _resample(band, 0, vf, t.v_coeffs) if t.need_vertical else band[vf[0]:vf[0] + vf.size]
    rel = hf - t.base_col
    if not t.need_horizontal:
        return np.ascontiguousarray(tmp[:, rel[0]:rel[0] + rel.size])
    return _resample(tmp, 1, rel, t.h_coeffs)


def resize_numpy(pixels: np.ndarray, width: int, height: int) -> np.ndarray:
    """`np.asarray(Image.fromarray(pixels).resize((width, height), Image.BILINEAR))` for uint8 RGB (h, w, 3) pixels,
    from the same tables and passes as the crop (the whole output as the window)."""
    pixels = np.asarray(pixels, dtype=np.uint8)
    h, w = pixels.shape[:2]
    plan = CropPlan(w, h, width, height, 0, 0, 0)
    return _passes(pixels, _tables(plan, 0, 0, height, width))


def resize_crop_numpy(pixels: np.ndarray, shorter: int = RESIZE_SHORTER, crop: int = CROP_SIZE) -> np.ndarray:
    """`np.asarray(center_crop(Image.fromarray(pixels)))` for uint8 RGB (h, w, 3) pixels, computed from the same
    tables as the device (aspect limit, Resize(shorter) BILINEAR, CenterCrop(crop)): C-contiguous uint8."""
    pixels = np.asarray(pixels, dtype=np.uint8)
    if pixels.ndim != 3 or pixels.shape[2] != 3:
        raise ValueError(f"expected uint8 RGB pixels (h, w, 3), got {pixels.shape}")
    pixels = limit_aspect_pixels(pixels)
    height, width = pixels.shape[:2]
    t = crop_tables(width, height, shorter, crop)
    if t is not None:
        return _passes(pixels, t)
    rw, rh = resized_size(width, height, shorter)
    if (rw, rh) != (width, height):  # resized smaller than the crop: resize it all, then pad and crop
        pixels = resize_numpy(pixels, rw, rh)
    return np.ascontiguousarray(crop_pixels(pixels, crop))


def place_images(images) -> tuple[list, int]:
    """[(output index, uint8 (h, w, 3) pixels)] packed back to back from byte 0 -> ([(byte offset, w, h, output
    index)], the images' total bytes): the `images` argument of `DeviceResize.enqueue` and the raw buffer's size."""
    placed, offset = [], 0
    for index, pixels in images:
        placed.append((offset, pixels.shape[1], pixels.shape[0], index))
        offset += pixels.nbytes
    return placed, offset


# resize.cl's kernel pairs: one work-item per pixel (the default), 4 pixels per work-item. On an H100 (2026-11-26,
# benchmarks/device_decode.py --variants) quad was no faster on 500x375 JPEGs (0.281 against 0.279 ms per 64) and
# 1.57x slower on the photo mix (1.041 against 0.665), so item stays the default; quad is kept to be measured.
VARIANTS = ("item", "quad")


class DeviceResize:
    """resize.cl: Resize(256) + CenterCrop(224) of a batch of raw RGB images, one launch per pass.

    Per call the host packs one int32 table (a descriptor per image, then each distinct size's cached coefficient
    block once) and uploads it; pass 1 writes into a scratch buffer kept between calls (grown when a batch needs
    more). Each call's upload waits for the previous call's last kernel, so reusing the buffers is safe on any queue.
    `variant`: which of resize.cl's kernel pairs runs (VARIANTS; the same bytes, benchmarks/device_decode.py
    --variants times them side by side).
    """

    MAX_SCRATCH_PIXELS = (1 << 31) - 1  # pass 1 indexes scratch pixels with an int

    def __init__(self, ctx, program, params: dict | None = None, variant: str = VARIANTS[0]):
        """params: RS_WG / RS_WX / RS_WY (variant item) or RS_QX / RS_RB (variant quad) if the program was built
        with other work-group sizes than the defaults."""
        if variant not in VARIANTS:
            raise ValueError(f"resize variant {variant!r} is not one of {', '.join(VARIANTS)}")
        params = params or {}
        self.ctx, self.variant = ctx, variant
        self.crop = CROP_SIZE
        self.wg, self.wx, self.wy = params.get("RS_WG", 128), params.get("RS_WX", 32), params.get("RS_WY", 4)
        self.qx, self.rb = params.get("RS_QX", 8), params.get("RS_RB", 16)
        names = ("resize_quad1", "resize_quad2") if variant == "quad" else ("resize_pass1", "resize_pass2")
        self.pass1 = Launch(cl.Kernel(program, names[0]))
        self.pass2 = Launch(cl.Kernel(program, names[1]))
        self._table = self._scratch = None
        self._table_bytes = self._scratch_bytes = 0
        self._last = None  # the previous call's last event
        self._uploads = deque(maxlen=4)  # recent table uploads: their events keep the host arrays alive

    @property
    def last_upload(self):
        """The last call's table upload, its first command: from its start to the returned event's end is that
        call's device time (benchmarks/device_decode.py)."""
        return self._uploads[-1] if self._uploads else None

    def pack(self, images, raw_bytes: int | None = None, out_slots: int | None = None) -> tuple[np.ndarray, int, int]:
        """The int32 table of one call (layout: kernels/resize.cl), the scratch pixels pass 1 writes and (variant
        quad) its work-groups. ValueError for an image the device path does not take, or (sizes given) one outside
        raw or an index outside out."""
        quad = self.variant == "quad"
        pixels, tiles, pos = 0, 0, len(images) * DESC
        descs, blocks, where = [], [], {}
        for i, (offset, width, height, index) in enumerate(images):
            t = crop_tables(width, height)
            if t is None:
                raise ValueError(f"image {i}: {width}x{height} is not resized on the device (crop_plan is None)")
            end = offset + width * height * 3
            if offset < 0 or (raw_bytes is not None and end > raw_bytes):
                raise ValueError(f"image {i}: bytes [{offset}, {end}) outside the raw buffer ({raw_bytes} bytes)")
            if index < 0 or (out_slots is not None and index >= out_slots):
                raise ValueError(f"image {i}: output index {index} outside the output buffer ({out_slots} crops)")
            at = where.get(t)
            if at is None:
                where[t] = at = pos
                blocks.append(t.block)
                pos += t.block.size
            padded = round_up(t.scratch_cols, 4) if quad else t.scratch_cols
            descs.append((offset & 0xFFFFFFFF, offset >> 32, width, 1 - t.horizontal_first, pixels, t.scratch_cols,
                          t.scratch_rows, t.base_row, t.base_col, at, t.k1, at + t.pass1_size, t.k2, index,
                          tiles if quad else 0, padded if quad else 0))
            pixels += t.scratch_rows * padded
            tiles += -(-t.scratch_rows // self.rb) * -(-padded // (4 * self.qx))
        if pixels > self.MAX_SCRATCH_PIXELS:
            raise ValueError(f"the batch needs {pixels} scratch pixels, more than one call handles; split it")
        head = np.array(descs, dtype=np.int64).astype(np.int32).ravel()  # the offset's low half wraps to int32
        return np.concatenate([head, *blocks]), pixels, tiles if quad else 0

    def enqueue(self, queue, raw, images, out, wait_for=None):
        """Resize + crop each image of `images` [(byte offset in raw, width, height, output index)], crop_plan not
        None for each, from `raw` (uint8 RGB images back to back) into `out` (uint8 (N, 224, 224, 3)) at its output
        index; other crops of out are left as they are. The kernels wait for `wait_for`; returns the last event."""
        if not images:
            return cl.enqueue_marker(queue, wait_for=wait_for)
        c = self.crop
        table, pixels, tiles = self.pack(images, raw.size, out.size // (c * c * 3))
        if table.nbytes > self._table_bytes:
            self._table_bytes = max(table.nbytes, 2 * self._table_bytes, 64 << 10)
            self._table = cl.Buffer(self.ctx, cl.mem_flags.READ_ONLY, self._table_bytes)
        if 3 * pixels > self._scratch_bytes:
            self._scratch_bytes = max(3 * pixels, self._scratch_bytes + self._scratch_bytes // 2)
            self._scratch = cl.Buffer(self.ctx, cl.mem_flags.READ_WRITE, self._scratch_bytes)
        after = [self._last] if self._last is not None else None
        upload = cl.enqueue_copy(queue, self._table, table, is_blocking=False, wait_for=after)
        self._uploads.append(upload)
        n = len(images)
        waits = [upload, *(wait_for or ())]
        if self.variant == "quad":
            qx, rb = self.qx, self.rb
            ev = self.pass1(queue, (tiles * qx, rb), (qx, rb), raw, self._table, self._scratch, n, wait_for=waits)
            ev = self.pass2(queue, (round_up(c // 4, qx), round_up(c, rb), n), (qx, rb, 1), self._scratch,
                            self._table, out, n, wait_for=[ev])
        else:
            ev = self.pass1(queue, (round_up(pixels, self.wg),), (self.wg,), raw, self._table, self._scratch, n,
                            pixels, wait_for=waits)
            ev = self.pass2(queue, (round_up(c, self.wx), round_up(c, self.wy), n), (self.wx, self.wy, 1),
                            self._scratch, self._table, out, n, wait_for=[ev])
        self._last = ev
        return ev
