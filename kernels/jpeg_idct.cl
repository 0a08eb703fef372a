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
 * modulo 1024 (RANGE_MASK) is clamp(x + 128) for x in [-512, 511]: written here as that arithmetic. libjpeg's
 * intermediates are 64-bit (JLONG); these are 32-bit, with the same results:
 *   - pass 1: with every dequantised coefficient within JI_LIMIT, no intermediate exceeds 7.3e8 in magnitude (an
 *     interval bound over every step), so 32-bit arithmetic is exact, its descaled results too;
 *   - pass 2 is additions, subtractions and multiplications by constants (a ring's operations, exact modulo 2^32 in
 *     unsigned arithmetic) up to the final descale, and the output reads only bits 18 to 27 of its sum (the shift
 *     by 18, then modulo 1024): bits that the sum modulo 2^32 holds as the 64-bit sum does. (That is why
 *     libjpeg-turbo's SIMD, with 32-bit lanes, matches its C code.)
 * Coefficients beyond JI_LIMIT never come from an encoder of 8-bit samples (|value| <= 1024 + q/2); there
 * libjpeg-turbo's 16-bit SIMD lanes and its C code may part, so such a file is left to the CPU path.
 * Grid: 8 work-items per block (JI_WG / 8 blocks per work-group), the block's plane found by a binary search of p[0].
 * Work-item r of a block loads and dequantises the block's row r (the work-group's blocks are contiguous in coef),
 * then through local memory takes column r for pass 1 and row r for pass 2, and stores that row's 8 samples.
 * (One work-item per block, the first version, needed about 130 registers for the block: few of them ran at once.)
 */

#define JI_PLANE 12
#ifndef JI_WG
#define JI_WG 64  /* work-items per work-group: 8 per block, so 8 blocks */
#endif
#define JI_LIMIT 4096
#define JI_TOO_LARGE 5

#define CONST_BITS 13
#define PASS1_BITS 2
#define FIX_0_298631336 2446u
#define FIX_0_390180644 3196u
#define FIX_0_541196100 4433u
#define FIX_0_765366865 6270u
#define FIX_0_899976223 7373u
#define FIX_1_175875602 9633u
#define FIX_1_501321110 12299u
#define FIX_1_847759065 15137u
#define FIX_1_961570560 16069u
#define FIX_2_053119869 16819u
#define FIX_2_562915447 20995u
#define FIX_3_072711026 25172u
#define DESCALE1(x) ((int)((x) + (1u << (CONST_BITS - PASS1_BITS - 1))) >> (CONST_BITS - PASS1_BITS))

/* pass 2's output from its 32-bit sum: bits 18..27 of sum + 2^17 (libjpeg's descale, then its index modulo 1024)
 * as a signed 10-bit value, range-limited */
inline uchar ji_limit(const uint x)
{
    const int v = (int)(((x + (1u << (CONST_BITS + PASS1_BITS + 2))) >> (CONST_BITS + PASS1_BITS + 3)) & 1023u);
    return (uchar)clamp(((v ^ 512) - 512) + 128, 0, 255);
}

/* the 1-D odd and even parts shared by both passes: in[0..7] -> out[0..7] before descaling */
inline void ji_1d(const uint i0, const uint i1, const uint i2, const uint i3, const uint i4, const uint i5,
                  const uint i6, const uint i7, uint *o)
{
    uint z2 = i2, z3 = i6;
    uint z1 = (z2 + z3) * FIX_0_541196100;
    uint tmp2 = z1 + z3 * (-FIX_1_847759065);
    uint tmp3 = z1 + z2 * FIX_0_765366865;
    uint tmp0 = (i0 + i4) << CONST_BITS;
    uint tmp1 = (i0 - i4) << CONST_BITS;
    const uint tmp10 = tmp0 + tmp3, tmp13 = tmp0 - tmp3, tmp11 = tmp1 + tmp2, tmp12 = tmp1 - tmp2;
    tmp0 = i7; tmp1 = i5; tmp2 = i3; tmp3 = i1;
    z1 = tmp0 + tmp3;
    z2 = tmp1 + tmp2;
    z3 = tmp0 + tmp2;
    uint z4 = tmp1 + tmp3;
    const uint z5 = (z3 + z4) * FIX_1_175875602;
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

__kernel __attribute__((reqd_work_group_size(JI_WG, 1, 1)))
void jpeg_idct(__global const short *coef, __global const int *meta, const int plane_at, const int quant_at,
               __global uchar *out, __global int *status, const int status_at, const int nplanes, const int nblocks)
{
    __local int t[JI_WG / 8][8][9];  /* each block's 8 x 8 values, rows padded to 9 ints: no bank conflicts */
    const int lid = get_local_id(0), lb = lid >> 3, r = lid & 7;  /* the block of the group, and a row/column */
    const int g = get_group_id(0) * (JI_WG / 8) + lb;
    const int live = g < nblocks;
    __global const int *plane = meta + plane_at, *p = plane;
    if (live) {
        int lo = 0, hi = nplanes - 1;
        while (lo < hi) {  /* the last plane whose first block is <= g */
            const int mid = (lo + hi + 1) >> 1;
            if (plane[mid * JI_PLANE] <= g) lo = mid; else hi = mid - 1;
        }
        p = plane + lo * JI_PLANE;
        /* row r of the block, dequantised (16 contiguous bytes per work-item: a warp reads 512) */
        const int8 v = convert_int8(vload8(r, coef + (long)g * 64)) * vload8(r, meta + quant_at + p[3] * 64);
        if (any((v > JI_LIMIT) | (v < -JI_LIMIT))) status[status_at + p[5]] = JI_TOO_LARGE;
        __local int *row = t[lb][r];
        row[0] = v.s0; row[1] = v.s1; row[2] = v.s2; row[3] = v.s3;
        row[4] = v.s4; row[5] = v.s5; row[6] = v.s6; row[7] = v.s7;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    uint o[8];
    if (live)  /* pass 1 on column r */
        ji_1d(t[lb][0][r], t[lb][1][r], t[lb][2][r], t[lb][3][r], t[lb][4][r], t[lb][5][r], t[lb][6][r], t[lb][7][r],
              o);
    barrier(CLK_LOCAL_MEM_FENCE);
    if (live)
        for (int k = 0; k < 8; ++k) t[lb][k][r] = DESCALE1(o[k]);
    barrier(CLK_LOCAL_MEM_FENCE);
    if (!live) return;
    /* pass 2 on row r, its 8 samples stored at once */
    __local const int *w = t[lb][r];
    ji_1d(w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7], o);
    const int local_block = g - p[0], bw = p[1];
    const int br = local_block / bw, bc = local_block - br * bw;
    const uchar8 samples = (uchar8)(ji_limit(o[0]), ji_limit(o[1]), ji_limit(o[2]), ji_limit(o[3]), ji_limit(o[4]),
                                    ji_limit(o[5]), ji_limit(o[6]), ji_limit(o[7]));
    vstore8(samples, 0, out + p[4] + (long)(br * 8 + r) * (bw * 8) + bc * 8);
}
