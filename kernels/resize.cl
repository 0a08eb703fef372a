/* resize.cl -- torchvision Resize(256) + CenterCrop(224) of raw RGB images on the device, bit for bit as Pillow's
 * BILINEAR resampling (src/libImaging/Resample.c, 8 bits per channel) followed by the crop (model/resize.py).
 *
 *   raw:     the images back to back, each uint8 H x W x 3 row-major     px(y, x, c) = raw[off + (y * W + x) * 3 + c]
 *   tab:     int32: n descriptors of RS_DESC ints, then the coefficient tables they point into
 *            d[0], d[1] byte offset of the image in raw (low, high 32 bits)   d[2] W, the source width
 *            d[3] order: 0 horizontal pass first, 1 vertical pass first (Pillow's choice for that resize)
 *            d[4] p0, the image's first pixel in scratch (the earlier images' SR * SC summed)
 *            d[5] SC, d[6] SR: scratch columns and rows of the image
 *            d[7] y0 (order 0: first source row of pass 1), d[8] x0 (order 1: first source column of pass 1)
 *            d[9] t1, d[10] K1: pass 1's table at tab[t1]; d[11] t2, d[12] K2: pass 2's table at tab[t2]
 *            d[13] o, the crop's index in out; d[14] the image's first pass-1 tile and d[15] SP, the padded
 *            scratch row (variant quad below; SP = SC and d[14] unused in variant item)
 *            table entry = 2 + K ints: first source index f, number of taps t, K fixed-point coefficients k[0..t)
 *   scratch: uint8 pixels x 3, pass 1's output; the image's part is SR x SP x 3 at pixel p0   tmp(r, s, c)
 *   out:     uint8 N x CROP x CROP x 3                                      out[((o * CROP + y) * CROP + x) * 3 + c]
 *
 *   order 0 (SR = rows R the crop's vertical supports cover, SC = CROP):
 *     pass 1  tmp(r, x, c)   = clip8(2^21 + sum_j px(y0 + r, f_x + j, c) * k_x[j])       entries per crop column x
 *     pass 2  out(o, y, x, c) = clip8(2^21 + sum_j tmp(f_y + j, x, c) * k_y[j])          f_y relative to y0
 *   order 1 (SR = CROP, SC = columns the crop's horizontal supports cover):
 *     pass 1  tmp(y, s, c)   = clip8(2^21 + sum_j px(f_y + j, x0 + s, c) * k_y[j])       entries per crop row y
 *     pass 2  out(o, y, x, c) = clip8(2^21 + sum_j tmp(y, f_x + j, c) * k_x[j])          f_x relative to x0
 *   clip8(a) = clamp(a >> 22, 0, 255), Pillow's int accumulation (22 fraction bits) and clip
 * k = Pillow's normalised coefficients in fixed point, computed by the host in float64 as Pillow does. Pillow
 * resamples the whole image; each output depends on its own coefficients only, so computing just the crop's rows
 * and columns (and in pass 1 just the source lines that pass 2 reads) gives the same bytes. An axis that keeps its
 * size (a pass Pillow skips) gets an identity table (one tap of 2^22), which copies exactly.
 *
 * Two variants of the same arithmetic (ops/resize.py DeviceResize(variant=...)), the same bytes:
 *   "quad" (resize_quad1, resize_quad2, the default): a work-item computes 4 adjacent pixels of a row (12 bytes,
 *     stored as 3 aligned uchar4), a work-group a tile of RS_QX quads x RS_RB rows of one image. The scratch rows
 *     are padded to SP = SC rounded up to 4 pixels (d[15]) and p0 counts padded pixels, so every quad starts on a
 *     4-byte boundary of scratch and of out (CROP a multiple of 4). Pass 1's grid is the images' tiles back to
 *     back, d[14] the image's first tile (one binary search per work-group, its value the same on every
 *     work-item); pass 2's is (CROP / 4 rounded up to RS_QX, CROP rounded up to RS_RB, n). Where 4 outputs share
 *     their coefficients (order 0's pass 2, order 1's pass 1) a tap is one 12-byte read for all of them.
 *   "item" (resize_pass1, resize_pass2: the first version, kept to compare): one work-item per pixel, 3 channels
 *     each. Pass 1 (sum of SR * SC rounded up to RS_WG), the image found by a binary search of p0 per work-item;
 *     pass 2 (CROP rounded up to RS_WX, CROP rounded up to RS_WY, n). d[14], d[15] unused, SP = SC.
 * Work-items past an image's end return at once (or, in a quad that straddles SC, leave its last pixels zero).
 */

#ifndef RS_WG
#define RS_WG 128  /* pass 1 work-group size */
#endif
#ifndef RS_WX
#define RS_WX 32   /* pass 2 work-group size along the crop's columns */
#endif
#ifndef RS_WY
#define RS_WY 4    /* pass 2 work-group size along the crop's rows */
#endif
#ifndef RS_QX
#define RS_QX 8    /* variant quad: quads (4 pixels) per work-group along a row */
#endif
#ifndef RS_RB
#define RS_RB 16   /* variant quad: rows per work-group */
#endif
#ifndef CROP
#define CROP 224
#endif
#if CROP % 4
#error "CROP must be a multiple of 4 (variant quad stores 4 pixels at a time)"
#endif
#define RS_DESC 16
#define RS_HALF (1 << 21)
#define RS_SHIFT 22

inline uchar rs_clip8(const int acc) { return (uchar)clamp(acc >> RS_SHIFT, 0, 255); }

/* 3 channels of the taps' weighted sum from p, consecutive taps `stride` bytes apart, into o */
inline void rs_taps(__global const uchar *p, const size_t stride, __global const int *e, __global uchar *o)
{
    const int taps = e[1];
    int s0 = RS_HALF, s1 = RS_HALF, s2 = RS_HALF;
    for (int j = 0; j < taps; ++j) {
        const int k = e[2 + j];
        s0 += (int)p[0] * k;
        s1 += (int)p[1] * k;
        s2 += (int)p[2] * k;
        p += stride;
    }
    o[0] = rs_clip8(s0);
    o[1] = rs_clip8(s1);
    o[2] = rs_clip8(s2);
}

__kernel __attribute__((reqd_work_group_size(RS_WG, 1, 1)))
void resize_pass1(__global const uchar *restrict raw, __global const int *restrict tab,
                  __global uchar *restrict scratch, const int n, const int total)
{
    const int g = get_global_id(0);
    if (g >= total) return;
    int lo = 0, hi = n - 1;  /* the last image whose p0 <= g (p0 ascending, every image has pixels) */
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (tab[mid * RS_DESC + 4] <= g) lo = mid; else hi = mid - 1;
    }
    __global const int *d = tab + lo * RS_DESC;
    const ulong off = (ulong)(uint)d[0] | ((ulong)(uint)d[1] << 32);
    const int W = d[2], SC = d[5], K1 = d[10];
    const int q = g - d[4], r = q / SC, s = q - r * SC;
    __global const int *e;
    size_t row, col, stride;
    if (d[3] == 0) {  /* horizontal first: scratch row r is source row y0 + r, column s is crop column s */
        e = tab + d[9] + s * (2 + K1);
        row = (size_t)(d[7] + r);
        col = (size_t)e[0];
        stride = 3;
    } else {          /* vertical first: scratch row r is crop row r, column s is source column x0 + s */
        e = tab + d[9] + r * (2 + K1);
        row = (size_t)e[0];
        col = (size_t)(d[8] + s);
        stride = (size_t)W * 3;
    }
    rs_taps(raw + off + (row * W + col) * 3, stride, e, scratch + (size_t)g * 3);
}

__kernel __attribute__((reqd_work_group_size(RS_WX, RS_WY, 1)))
void resize_pass2(__global const uchar *restrict scratch, __global const int *restrict tab,
                  __global uchar *restrict out, const int n)
{
    const int x = get_global_id(0), y = get_global_id(1), i = get_global_id(2);
    if (x >= CROP || y >= CROP || i >= n) return;
    __global const int *d = tab + i * RS_DESC;
    const int SC = d[5], K2 = d[12];
    __global const int *e;
    size_t at, stride;
    if (d[3] == 0) {  /* vertical pass over scratch rows, entry per crop row */
        e = tab + d[11] + y * (2 + K2);
        at = (size_t)d[4] + (size_t)e[0] * SC + x;
        stride = (size_t)SC * 3;
    } else {          /* horizontal pass over scratch columns, entry per crop column */
        e = tab + d[11] + x * (2 + K2);
        at = (size_t)d[4] + (size_t)y * SC + e[0];
        stride = 3;
    }
    rs_taps(scratch + at * 3, stride, e, out + (((size_t)d[13] * CROP + y) * CROP + x) * 3);
}

/* ---- variant quad ---- */

/* 12 sums of `taps` (entry e) over 12 consecutive bytes at p, consecutive taps `stride` bytes apart: the 4 pixels
 * share their coefficients. `aligned`: p and stride are multiples of 4 (read as 3 uchar4); else bytes, only the
 * first 3 * live of them (the rest of the image may end there). */
inline void rs_quad_shared(__global const uchar *p, const size_t stride, __global const int *e, const int aligned,
                           const int live, int *acc)
{
    const int taps = e[1];
    for (int c = 0; c < 12; ++c) acc[c] = RS_HALF;
    if (aligned) {
        for (int j = 0; j < taps; ++j) {
            const int k = e[2 + j];
            __global const uchar4 *q = (__global const uchar4 *)p;
            const int4 a = convert_int4(q[0]), b = convert_int4(q[1]), c = convert_int4(q[2]);
            acc[0] += a.x * k; acc[1] += a.y * k; acc[2] += a.z * k; acc[3] += a.w * k;
            acc[4] += b.x * k; acc[5] += b.y * k; acc[6] += b.z * k; acc[7] += b.w * k;
            acc[8] += c.x * k; acc[9] += c.y * k; acc[10] += c.z * k; acc[11] += c.w * k;
            p += stride;
        }
    } else {
        const int bytes = 3 * live;
        for (int j = 0; j < taps; ++j) {
            const int k = e[2 + j];
            for (int c = 0; c < bytes; ++c) acc[c] += (int)p[c] * k;
            p += stride;
        }
    }
}

/* 3 sums of one pixel's taps (entry e) from p, consecutive taps 3 bytes apart, into acc[0..2] */
inline void rs_pixel(__global const uchar *p, __global const int *e, int *acc)
{
    const int taps = e[1];
    int s0 = RS_HALF, s1 = RS_HALF, s2 = RS_HALF;
    for (int j = 0; j < taps; ++j) {
        const int k = e[2 + j];
        s0 += (int)p[0] * k;
        s1 += (int)p[1] * k;
        s2 += (int)p[2] * k;
        p += 3;
    }
    acc[0] = s0;
    acc[1] = s1;
    acc[2] = s2;
}

/* the 12 clipped bytes of acc at o, a 4-byte aligned address */
inline void rs_store_quad(__global uchar *o, const int *acc)
{
    __global uchar4 *q = (__global uchar4 *)o;
    q[0] = (uchar4)(rs_clip8(acc[0]), rs_clip8(acc[1]), rs_clip8(acc[2]), rs_clip8(acc[3]));
    q[1] = (uchar4)(rs_clip8(acc[4]), rs_clip8(acc[5]), rs_clip8(acc[6]), rs_clip8(acc[7]));
    q[2] = (uchar4)(rs_clip8(acc[8]), rs_clip8(acc[9]), rs_clip8(acc[10]), rs_clip8(acc[11]));
}

__kernel __attribute__((reqd_work_group_size(RS_QX, RS_RB, 1)))
void resize_quad1(__global const uchar *restrict raw, __global const int *restrict tab,
                  __global uchar *restrict scratch, const int n)
{
    const int g = get_group_id(0);
    int lo = 0, hi = n - 1;  /* the last image whose first tile <= g: the same on every work-item of the group */
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (tab[mid * RS_DESC + 14] <= g) lo = mid; else hi = mid - 1;
    }
    __global const int *d = tab + lo * RS_DESC;
    const int W = d[2], SC = d[5], SR = d[6], SP = d[15], K1 = d[10];
    const int across = (SP / 4 + RS_QX - 1) / RS_QX, t = g - d[14], band = t / across;
    const int r = band * RS_RB + (int)get_local_id(1);
    const int s = ((t - band * across) * RS_QX + (int)get_local_id(0)) * 4;
    if (r >= SR || s >= SP) return;
    const ulong off = (ulong)(uint)d[0] | ((ulong)(uint)d[1] << 32);
    const int live = min(4, SC - s);
    int acc[12];
    for (int c = 0; c < 12; ++c) acc[c] = 0;
    if (d[3] == 0) {  /* horizontal first: source row y0 + r; each of the 4 crop columns has its own entry */
        __global const uchar *row = raw + off + (size_t)(d[7] + r) * W * 3;
        __global const int *e = tab + d[9] + s * (2 + K1);
        for (int k = 0; k < 4; ++k, e += 2 + K1) rs_pixel(row + (size_t)e[0] * 3, e, acc + 3 * k);
    } else {          /* vertical first: crop row r's entry for the 4 source columns x0 + s .. */
        __global const int *e = tab + d[9] + r * (2 + K1);
        rs_quad_shared(raw + off + ((size_t)e[0] * W + d[8] + s) * 3, (size_t)W * 3, e, 0, live, acc);
    }
    rs_store_quad(scratch + ((size_t)d[4] + (size_t)r * SP + s) * 3, acc);
}

__kernel __attribute__((reqd_work_group_size(RS_QX, RS_RB, 1)))
void resize_quad2(__global const uchar *restrict scratch, __global const int *restrict tab,
                  __global uchar *restrict out, const int n)
{
    const int x = get_global_id(0) * 4, y = get_global_id(1), i = get_global_id(2);
    if (x >= CROP || y >= CROP || i >= n) return;
    __global const int *d = tab + i * RS_DESC;
    const int SP = d[15], K2 = d[12];
    int acc[12];
    if (d[3] == 0) {  /* vertical pass over scratch rows: crop row y's entry for the 4 columns */
        __global const int *e = tab + d[11] + y * (2 + K2);
        rs_quad_shared(scratch + ((size_t)d[4] + (size_t)e[0] * SP + x) * 3, (size_t)SP * 3, e, 1, 4, acc);
    } else {          /* horizontal pass along scratch row y: each crop column its own entry */
        __global const uchar *row = scratch + ((size_t)d[4] + (size_t)y * SP) * 3;
        __global const int *e = tab + d[11] + x * (2 + K2);
        for (int k = 0; k < 4; ++k, e += 2 + K2) rs_pixel(row + (size_t)e[0] * 3, e, acc + 3 * k);
    }
    rs_store_quad(out + (((size_t)d[13] * CROP + y) * CROP + x) * 3, acc);
}
