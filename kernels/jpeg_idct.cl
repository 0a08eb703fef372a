/* jpeg_idct.cl -- dequantisation and the accurate integer inverse DCT of baseline JPEG blocks, bit for bit as
 * libjpeg-turbo's jidctint.c (JDCT_ISLOW, 8-bit samples), which its SIMD versions match.
 *
 *   coef:   int16, 64 per block, natural order (jpeg_huffman.cl's output)
 *   meta:   int32: plane and quant below, at plane_at and quant_at
 *   plane:  int32, JI_PLANE ints per component plane (vggserve/decoding/device/tables.py):
 *           p[0] first block   p[1] W, blocks per row   p[2] blocks per column   p[3] quantisation table
 *           p[4] byte offset of its samples (W * 8 per sample row)   p[5] image   (p[6..] used by jpeg_color.cl)
 *   quant:  int32, 64 per table, natural order
 *   out:    uint8 samples: block (r, c) of a plane is rows 8r..8r+7, columns 8c..8c+7 at p[4] + y * 8W + x
 *   status: int32 per image from status_at: set to JI_TOO_LARGE where a dequantised coefficient is beyond JI_LIMIT
 *
 * Fixed point as in jidctint.c: CONST_BITS 13, PASS1_BITS 2. Pass 1 (columns) keeps int results scaled by 2^2;
 * pass 2 (rows) descales by 2^(13 + 2 + 3) and maps through libjpeg's range-limit table, which for an index x taken
 * modulo 1024 (RANGE_MASK) is clamp(x + 128) for x in [-512, 511]: written here as that arithmetic. Intermediates
 * are 64-bit like libjpeg's JLONG. Coefficients beyond JI_LIMIT never come from an encoder of 8-bit samples
 * (|value| <= 1024 + q/2); there libjpeg-turbo's 16-bit SIMD lanes and its C code may part, so such a file is left
 * to the CPU path.
 * Grid: one work-item per block, the plane found by a binary search of p[0]; items past the end return at once.
 */

#define JI_PLANE 12
#define JI_LIMIT 4096
#define JI_TOO_LARGE 5

#define CONST_BITS 13
#define PASS1_BITS 2
#define FIX_0_298631336 2446L
#define FIX_0_390180644 3196L
#define FIX_0_541196100 4433L
#define FIX_0_765366865 6270L
#define FIX_0_899976223 7373L
#define FIX_1_175875602 9633L
#define FIX_1_501321110 12299L
#define FIX_1_847759065 15137L
#define FIX_1_961570560 16069L
#define FIX_2_053119869 16819L
#define FIX_2_562915447 20995L
#define FIX_3_072711026 25172L
#define DESCALE(x, n) (((x) + (1L << ((n) - 1))) >> (n))

inline uchar ji_limit(const long x)
{
    const int v = (((int)x & 1023) ^ 512) - 512;  /* x modulo 1024, as a signed 10-bit value */
    return (uchar)clamp(v + 128, 0, 255);
}

/* the 1-D odd and even parts shared by both passes: in[0..7] -> out[0..7] before descaling */
inline void ji_1d(const long i0, const long i1, const long i2, const long i3, const long i4, const long i5,
                  const long i6, const long i7, long *o)
{
    long z2 = i2, z3 = i6;
    long z1 = (z2 + z3) * FIX_0_541196100;
    long tmp2 = z1 + z3 * (-FIX_1_847759065);
    long tmp3 = z1 + z2 * FIX_0_765366865;
    long tmp0 = (i0 + i4) << CONST_BITS;
    long tmp1 = (i0 - i4) << CONST_BITS;
    const long tmp10 = tmp0 + tmp3, tmp13 = tmp0 - tmp3, tmp11 = tmp1 + tmp2, tmp12 = tmp1 - tmp2;
    tmp0 = i7; tmp1 = i5; tmp2 = i3; tmp3 = i1;
    z1 = tmp0 + tmp3;
    z2 = tmp1 + tmp2;
    z3 = tmp0 + tmp2;
    long z4 = tmp1 + tmp3;
    const long z5 = (z3 + z4) * FIX_1_175875602;
    tmp0 = tmp0 * FIX_0_298631336;
    tmp1 = tmp1 * FIX_2_053119869;
    tmp2 = tmp2 * FIX_3_072711026;
    tmp3 = tmp3 * FIX_1_501321110;
    z1 = z1 * (-FIX_0_899976223);
    z2 = z2 * (-FIX_2_562915447);
    z3 = z3 * (-FIX_1_961570560) + z5;
    z4 = z4 * (-FIX_0_390180644) + z5;
    tmp0 += z1 + z3;
    tmp1 += z2 + z4;
    tmp2 += z2 + z3;
    tmp3 += z1 + z4;
    o[0] = tmp10 + tmp3; o[7] = tmp10 - tmp3;
    o[1] = tmp11 + tmp2; o[6] = tmp11 - tmp2;
    o[2] = tmp12 + tmp1; o[5] = tmp12 - tmp1;
    o[3] = tmp13 + tmp0; o[4] = tmp13 - tmp0;
}

__kernel void jpeg_idct(__global const short *coef, __global const int *meta, const int plane_at, const int quant_at,
                        __global uchar *out, __global int *status, const int status_at, const int nplanes,
                        const int nblocks)
{
    const int g = get_global_id(0);
    if (g >= nblocks) return;
    __global const int *plane = meta + plane_at, *quant = meta + quant_at;
    int lo = 0, hi = nplanes - 1;
    while (lo < hi) {  /* the last plane whose first block is <= g */
        const int mid = (lo + hi + 1) >> 1;
        if (plane[mid * JI_PLANE] <= g) lo = mid; else hi = mid - 1;
    }
    __global const int *p = plane + lo * JI_PLANE;
    const int local_block = g - p[0], bw = p[1];
    const int br = local_block / bw, bc = local_block % bw;
    __global const short *in = coef + (long)g * 64;
    __global const int *q = quant + p[3] * 64;
    int ws[64];
    int large = 0;
    for (int c = 0; c < 8; ++c) {
        long d[8];
        for (int k = 0; k < 8; ++k) {
            d[k] = (long)in[k * 8 + c] * q[k * 8 + c];
            large |= (d[k] > JI_LIMIT) | (d[k] < -JI_LIMIT);
        }
        long o[8];
        ji_1d(d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7], o);
        for (int k = 0; k < 8; ++k) ws[k * 8 + c] = (int)DESCALE(o[k], CONST_BITS - PASS1_BITS);
    }
    if (large) status[status_at + p[5]] = JI_TOO_LARGE;
    const int stride = bw * 8;
    __global uchar *dst = out + p[4] + (long)(br * 8) * stride + bc * 8;
    for (int r = 0; r < 8; ++r) {
        const int *w = ws + r * 8;
        long o[8];
        ji_1d(w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7], o);
        uchar8 row;
        row.s0 = ji_limit(DESCALE(o[0], CONST_BITS + PASS1_BITS + 3));
        row.s1 = ji_limit(DESCALE(o[1], CONST_BITS + PASS1_BITS + 3));
        row.s2 = ji_limit(DESCALE(o[2], CONST_BITS + PASS1_BITS + 3));
        row.s3 = ji_limit(DESCALE(o[3], CONST_BITS + PASS1_BITS + 3));
        row.s4 = ji_limit(DESCALE(o[4], CONST_BITS + PASS1_BITS + 3));
        row.s5 = ji_limit(DESCALE(o[5], CONST_BITS + PASS1_BITS + 3));
        row.s6 = ji_limit(DESCALE(o[6], CONST_BITS + PASS1_BITS + 3));
        row.s7 = ji_limit(DESCALE(o[7], CONST_BITS + PASS1_BITS + 3));
        vstore8(row, 0, dst + (long)r * stride);
    }
}
