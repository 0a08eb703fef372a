/* jpeg_color.cl -- chroma upsampling and YCbCr -> RGB of decoded JPEG sample planes, bit for bit as libjpeg-turbo
 * (jdsample.c with fancy upsampling, its default; jdcolor.c's ycc_rgb_convert), with the EXIF orientation applied
 * as Pillow's ImageOps.exif_transpose does, into a window of the upright image.
 *
 *   samples: uint8 planes written by jpeg_idct.cl; plane at meta + plane_at (int32, JC_PLANE ints, tables.py):
 *            p[4] byte offset   p[1] * 8 the row stride   p[6], p[7] its downsampled width and height
 *            p[8], p[9] the upsampling factors (hmax / h, vmax / v)   p[10] method (JC_* below)
 *   win:     int32 at meta + win_at, JC_WIN ints per output window
 *            w[0] first output pixel (the earlier windows' pixels summed; the grid's binary search key)
 *            w[1], w[2] output byte offset (low, high 32 bits)   w[3] window width   w[4] window height
 *            w[5] x0   w[6] y0: the window's corner in the upright image   w[7] orientation (1..8, EXIF)
 *            w[8] stored width W   w[9] stored height H   w[10] Y plane   w[11] Cb plane   w[12] Cr plane (-1: gray)
 *            w[13] output row stride in pixels   w[14] the window's first tile (variant quad)
 *            w[15] its tiles along a row (variant quad)
 *   out:     uint8 RGB, pixel (x, y) of a window at offset + (y * stride + x) * 3
 *
 * Upsampling (a chroma sample c(i, j) of a plane with downsampled size cw x ch, indices clamped to it, which is
 * how libjpeg's edge columns and its context rows at the top and bottom come out):
 *   JC_FULL    c(x, y)
 *   JC_H2V1    triangle filter: (3 c(x/2, y) + c(x/2 -+ 1, y) + 1 or 2) >> 2 for even or odd x
 *   JC_H1V2    the same along y (h1v2_fancy_upsample)
 *   JC_H2V2    colsum(i) = 3 c(i, y/2) + c(i, y/2 -+ 1); (3 colsum(x/2) + colsum(x/2 -+ 1) + 8 or 7) >> 4
 *   JC_BOX     c(x / fh, y / fv) (int_upsample, and the 2:1 cases with cw <= 2, where libjpeg is not fancy)
 * Colour: R = y + ((91881 (cr - 128) + 2^15) >> 16), B = y + ((116130 (cb - 128) + 2^15) >> 16),
 *         G = y + ((-22554 (cb - 128) + 2^15 - 46802 (cr - 128)) >> 16), each clamped to 0..255.
 * Grids, two variants of the same arithmetic (decoder.py JpegDecoder(kernels=...)), the same bytes:
 *   jpeg_color_quad ("quad", the default): a work-item writes 4 adjacent pixels of a window's row (12 bytes, as 3
 *     uchar4 where the row's quad starts on a 4-byte boundary, else byte by byte), a work-group a tile of JC_QX
 *     quads x JC_RB rows of one window; the windows' tiles back to back, w[14] a window's first: one binary search
 *     per work-group (the same on each of its work-items), no division by the window's width, each descriptor read
 *     once per 4 pixels. A whole quad of an upright window whose chroma is 4:2:0 (the common photo) reads its 4 luma
 *     bytes as one vector and each chroma plane's 4 column sums once (jc_h2v2_quad: 8 samples per plane where the
 *     pixels one by one read 16).
 *   jpeg_color ("item", the first version, kept to compare): one work-item per output pixel over all windows, the
 *     window found by a binary search of w[0].
 */

#define JC_PLANE 12
#define JC_WIN 16
#define JC_FULL 0
#define JC_H2V1 1
#define JC_H1V2 2
#define JC_H2V2 3
#define JC_BOX 4
#ifndef JC_QX
#define JC_QX 16  /* variant quad: quads (4 pixels) per work-group along a row */
#endif
#ifndef JC_RB
#define JC_RB 4   /* variant quad: rows per work-group */
#endif
#ifndef JC_H1V2_ODD_BIAS
#define JC_H1V2_ODD_BIAS 2  /* libjpeg-turbo >= 2.1 rounds the lower row's half with 2, earlier ones with 1 */
#endif

inline int jc_at(__global const uchar *s, const int stride, const int x, const int y) { return s[y * stride + x]; }

inline int jc_chroma(__global const uchar *samples, __global const int *p, const int x, const int y)
{
    __global const uchar *s = samples + p[4];
    const int stride = p[1] * 8, cw = p[6], ch = p[7], method = p[10];
    if (method == JC_FULL) return jc_at(s, stride, x, y);
    if (method == JC_H2V1) {
        const int i = x >> 1, odd = x & 1;
        const int n = odd ? min(i + 1, cw - 1) : max(i - 1, 0);
        return (3 * jc_at(s, stride, i, y) + jc_at(s, stride, n, y) + 1 + odd) >> 2;
    }
    if (method == JC_H1V2) {
        const int j = y >> 1, odd = y & 1;
        const int n = odd ? min(j + 1, ch - 1) : max(j - 1, 0);
        return (3 * jc_at(s, stride, x, j) + jc_at(s, stride, x, n) + (odd ? JC_H1V2_ODD_BIAS : 1)) >> 2;
    }
    if (method == JC_H2V2) {
        const int j = y >> 1, jn = (y & 1) ? min(j + 1, ch - 1) : max(j - 1, 0);
        const int i = x >> 1, odd = x & 1;
        const int in = odd ? min(i + 1, cw - 1) : max(i - 1, 0);
        const int here = 3 * jc_at(s, stride, i, j) + jc_at(s, stride, i, jn);
        const int there = 3 * jc_at(s, stride, in, j) + jc_at(s, stride, in, jn);
        return (3 * here + there + 8 - odd) >> 4;
    }
    return jc_at(s, stride, x / p[8], y / p[9]);
}

/* the stored pixel that upright pixel (ux, uy) shows, for EXIF orientation o of a W x H stored image */
inline int2 jc_stored(const int o, const int ux, const int uy, const int W, const int H)
{
    switch (o) {
    case 2: return (int2)(W - 1 - ux, uy);          /* FLIP_LEFT_RIGHT */
    case 3: return (int2)(W - 1 - ux, H - 1 - uy);  /* ROTATE_180 */
    case 4: return (int2)(ux, H - 1 - uy);          /* FLIP_TOP_BOTTOM */
    case 5: return (int2)(uy, ux);                  /* TRANSPOSE */
    case 6: return (int2)(uy, H - 1 - ux);          /* ROTATE_270 */
    case 7: return (int2)(W - 1 - uy, H - 1 - ux);  /* TRANSVERSE */
    case 8: return (int2)(W - 1 - uy, ux);          /* ROTATE_90 */
    default: return (int2)(ux, uy);
    }
}

__kernel void jpeg_color(__global const uchar *samples, __global const int *meta, const int plane_at,
                         const int win_at, __global uchar *out, const int nwin, const int npixels)
{
    const int g = get_global_id(0);
    if (g >= npixels) return;
    __global const int *plane = meta + plane_at, *win = meta + win_at;
    int lo = 0, hi = nwin - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (win[mid * JC_WIN] <= g) lo = mid; else hi = mid - 1;
    }
    __global const int *w = win + lo * JC_WIN;
    const int local_pixel = g - w[0], ww = w[3];
    const int ox = local_pixel % ww, oy = local_pixel / ww;
    const int2 st = jc_stored(w[7], w[5] + ox, w[6] + oy, w[8], w[9]);
    __global const int *py = plane + w[10] * JC_PLANE;
    const int y = jc_at(samples + py[4], py[1] * 8, st.x, st.y);
    int r = y, gg = y, b = y;
    if (w[11] >= 0) {
        const int cb = jc_chroma(samples, plane + w[11] * JC_PLANE, st.x, st.y) - 128;
        const int cr = jc_chroma(samples, plane + w[12] * JC_PLANE, st.x, st.y) - 128;
        r = clamp(y + ((91881 * cr + 32768) >> 16), 0, 255);
        gg = clamp(y + ((-22554 * cb + 32768 - 46802 * cr) >> 16), 0, 255);
        b = clamp(y + ((116130 * cb + 32768) >> 16), 0, 255);
    }
    const ulong offset = ((ulong)(uint)w[2] << 32) | (uint)w[1];
    __global uchar *o = out + offset + ((long)oy * w[13] + ox) * 3;
    o[0] = (uchar)r;
    o[1] = (uchar)gg;
    o[2] = (uchar)b;
}

/* ---- variant quad ---- */

/* a plane's fields, read once per work-item */
typedef struct {
    __global const uchar *s;
    int stride, cw, ch, method, fh, fv;
} jc_plane;

inline jc_plane jc_plane_of(__global const uchar *samples, __global const int *p)
{
    jc_plane c;
    c.s = samples + p[4];
    c.stride = p[1] * 8;
    c.cw = p[6];
    c.ch = p[7];
    c.method = p[10];
    c.fh = p[8];
    c.fv = p[9];
    return c;
}

/* jc_chroma on a plane's read fields */
inline int jc_upsampled(const jc_plane c, const int x, const int y)
{
    __global const uchar *s = c.s;
    const int stride = c.stride;
    if (c.method == JC_FULL) return jc_at(s, stride, x, y);
    if (c.method == JC_H2V1) {
        const int i = x >> 1, odd = x & 1;
        const int n = odd ? min(i + 1, c.cw - 1) : max(i - 1, 0);
        return (3 * jc_at(s, stride, i, y) + jc_at(s, stride, n, y) + 1 + odd) >> 2;
    }
    if (c.method == JC_H1V2) {
        const int j = y >> 1, odd = y & 1;
        const int n = odd ? min(j + 1, c.ch - 1) : max(j - 1, 0);
        return (3 * jc_at(s, stride, x, j) + jc_at(s, stride, x, n) + (odd ? JC_H1V2_ODD_BIAS : 1)) >> 2;
    }
    if (c.method == JC_H2V2) {
        const int j = y >> 1, jn = (y & 1) ? min(j + 1, c.ch - 1) : max(j - 1, 0);
        const int i = x >> 1, odd = x & 1;
        const int in = odd ? min(i + 1, c.cw - 1) : max(i - 1, 0);
        const int here = 3 * jc_at(s, stride, i, j) + jc_at(s, stride, i, jn);
        const int there = 3 * jc_at(s, stride, in, j) + jc_at(s, stride, in, jn);
        return (3 * here + there + 8 - odd) >> 4;
    }
    return jc_at(s, stride, x / c.fh, y / c.fv);
}

/* the column sums 3 c(i, j) + c(i, jn) of a 2:1 x 2:1 plane for columns i0 - 1 .. i0 + 2 (clamped to the plane,
 * as jc_upsampled clamps its neighbours), rows j and jn: 4 bytes from each row where all four lie inside it */
inline int4 jc_colsums(const jc_plane c, const int i0, const int j, const int jn)
{
    __global const uchar *a = c.s + j * c.stride, *b = c.s + jn * c.stride;
    if (i0 >= 1 && i0 + 2 < c.cw)
        return 3 * convert_int4(vload4(0, a + i0 - 1)) + convert_int4(vload4(0, b + i0 - 1));
    const int c0 = max(i0 - 1, 0), c1 = min(i0, c.cw - 1), c2 = min(i0 + 1, c.cw - 1), c3 = min(i0 + 2, c.cw - 1);
    return (int4)(3 * a[c0] + b[c0], 3 * a[c1] + b[c1], 3 * a[c2] + b[c2], 3 * a[c3] + b[c3]);
}

/* jc_upsampled of a 2:1 x 2:1 plane (JC_H2V2) at the 4 stored pixels x .. x + 3 of row y, from 8 samples: pixel x + k
 * is column i = (x + k) / 2 with its neighbour i -+ 1 (even or odd x + k), columns i0 - 1 .. i0 + 2 of cs */
inline int4 jc_h2v2_quad(const jc_plane c, const int x, const int y)
{
    const int j = y >> 1, jn = (y & 1) ? min(j + 1, c.ch - 1) : max(j - 1, 0), i0 = x >> 1;
    const int4 cs = jc_colsums(c, i0, j, jn);
    if (x & 1)  /* x odd: columns i0, i0 + 1, i0 + 1, i0 + 2, neighbours i0 + 1, i0, i0 + 2, i0 + 1 */
        return (int4)((3 * cs.s1 + cs.s2 + 7) >> 4, (3 * cs.s2 + cs.s1 + 8) >> 4, (3 * cs.s2 + cs.s3 + 7) >> 4,
                      (3 * cs.s3 + cs.s2 + 8) >> 4);
    /* x even: columns i0, i0, i0 + 1, i0 + 1, neighbours i0 - 1, i0 + 1, i0, i0 + 2 */
    return (int4)((3 * cs.s1 + cs.s0 + 8) >> 4, (3 * cs.s1 + cs.s2 + 7) >> 4, (3 * cs.s2 + cs.s1 + 8) >> 4,
                  (3 * cs.s2 + cs.s3 + 7) >> 4);
}

__kernel __attribute__((reqd_work_group_size(JC_QX, JC_RB, 1)))
void jpeg_color_quad(__global const uchar *samples, __global const int *meta, const int plane_at,
                     const int win_at, __global uchar *out, const int nwin)
{
    const int g = get_group_id(0);
    __global const int *plane = meta + plane_at, *win = meta + win_at;
    int lo = 0, hi = nwin - 1;  /* the last window whose first tile <= g: the same on every work-item */
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (win[mid * JC_WIN + 14] <= g) lo = mid; else hi = mid - 1;
    }
    __global const int *w = win + lo * JC_WIN;
    const int ww = w[3], t = g - w[14], across = w[15], band = t / across;
    const int oy = band * JC_RB + (int)get_local_id(1);
    const int ox = ((t - band * across) * JC_QX + (int)get_local_id(0)) * 4;
    if (oy >= w[4] || ox >= ww) return;
    const int live = min(4, ww - ox), o = w[7], x0 = w[5] + ox, uy = w[6] + oy, W = w[8], H = w[9];
    const jc_plane py = jc_plane_of(samples, plane + w[10] * JC_PLANE);
    const int colour = w[11] >= 0;
    jc_plane pb = py, pr = py;
    if (colour) {
        pb = jc_plane_of(samples, plane + w[11] * JC_PLANE);
        pr = jc_plane_of(samples, plane + w[12] * JC_PLANE);
    }
    uchar v[12];
    if (o == 1 && colour && live == 4 && pb.method == JC_H2V2 && pr.method == JC_H2V2) {
        /* the common case (upright, 4:2:0, a whole quad): the row's 4 luma bytes at once, each chroma plane from
         * 8 samples (2 x 4 bytes) where per pixel it takes 4 */
        const int4 yy = convert_int4(vload4(0, py.s + uy * py.stride + x0));
        const int4 cb = jc_h2v2_quad(pb, x0, uy) - 128, cr = jc_h2v2_quad(pr, x0, uy) - 128;
        const int4 r = clamp(yy + ((91881 * cr + 32768) >> 16), 0, 255);
        const int4 gg = clamp(yy + ((-22554 * cb + 32768 - 46802 * cr) >> 16), 0, 255);
        const int4 b = clamp(yy + ((116130 * cb + 32768) >> 16), 0, 255);
        v[0] = r.s0; v[1] = gg.s0; v[2] = b.s0; v[3] = r.s1; v[4] = gg.s1; v[5] = b.s1;
        v[6] = r.s2; v[7] = gg.s2; v[8] = b.s2; v[9] = r.s3; v[10] = gg.s3; v[11] = b.s3;
    } else for (int k = 0; k < 4; ++k) {
        const int2 st = jc_stored(o, x0 + min(k, live - 1), uy, W, H);  /* past the window: its last pixel again */
        const int y = jc_at(py.s, py.stride, st.x, st.y);
        int r = y, gg = y, b = y;
        if (colour) {
            const int cb = jc_upsampled(pb, st.x, st.y) - 128, cr = jc_upsampled(pr, st.x, st.y) - 128;
            r = clamp(y + ((91881 * cr + 32768) >> 16), 0, 255);
            gg = clamp(y + ((-22554 * cb + 32768 - 46802 * cr) >> 16), 0, 255);
            b = clamp(y + ((116130 * cb + 32768) >> 16), 0, 255);
        }
        v[3 * k] = (uchar)r;
        v[3 * k + 1] = (uchar)gg;
        v[3 * k + 2] = (uchar)b;
    }
    const ulong offset = ((ulong)(uint)w[2] << 32) | (uint)w[1];
    __global uchar *dst = out + offset + ((long)oy * w[13] + ox) * 3;
    if (live == 4 && ((size_t)dst & 3) == 0) {
        __global uchar4 *q = (__global uchar4 *)dst;
        q[0] = (uchar4)(v[0], v[1], v[2], v[3]);
        q[1] = (uchar4)(v[4], v[5], v[6], v[7]);
        q[2] = (uchar4)(v[8], v[9], v[10], v[11]);
    } else {
        for (int c = 0; c < 3 * live; ++c) dst[c] = v[c];
    }
}
