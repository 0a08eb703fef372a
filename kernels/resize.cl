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
 *            d[13] o, the crop's index in out; d[14], d[15] unused
 *            table entry = 2 + K ints: first source index f, number of taps t, K fixed-point coefficients k[0..t)
 *   scratch: uint8 pixels x 3, pass 1's output; the image's part is SR x SC x 3 at pixel p0   tmp(r, s, c)
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
 * Grids: pass 1 (sum of SR * SC rounded up to RS_WG), the image found by a binary search of p0; pass 2 (CROP
 * rounded up to RS_WX, CROP rounded up to RS_WY, n). One work-item per pixel, 3 channels each; work-items past the
 * end return at once.
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
#ifndef CROP
#define CROP 224
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
