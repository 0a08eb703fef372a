/* conv_first.cl -- the network's first convolution (3x3, padding 1, few input channels) for the tensor-core family,
 * read straight from the model's float32 NCHW input: no NHWC copy of the input, and no tensor-core tile padding a
 * pixel's 3 channels to 8 and 27 k to 64 or 128 (features.0 ran at 7-14 TFLOP/s on conv_tc.cl).
 *
 *   out[p, n] = act( bias[n] + sum_{c, ky, kx} r(in[b, c, y + ky - 1, x + kx - 1]) * wt[n, c, ky, kx] )
 *   p = (b * H + y) * W + x, NHWC with CSTORE channels per pixel (zero from COUT on)
 *
 * r() rounds the input to the storage type as nhwc.cl's to_nhwc does (FP16: to nearest even; TF32: cvt.rna), and
 * the host passes the weights already rounded so (tensorcore.tc_weights' values), so every product is exact in FP32
 * as on the tensor cores; the sum is FP32 (fma, in the order c, ky, kx), then the epilogue of conv_tc.cl
 * (tc_epilogue.clh: + bias, ReLU; OUT_FP8 / OUT_INT8: scaled by out_scale_inv into the next layer's codes) and the
 * conversions of mma.clh's STORE2 (out_t: FP16, FP32 rounded to TF32, e4m3 or u8 codes).
 *
 * A work-item computes CF_PIX pixels (CF_WG apart), all COUT channels, 8 at a time; a work-group CF_WG * CF_PIX
 * consecutive pixels:
 *   - the weights, tap-major (w[t * CF_COUTP + n]), are read 4 channels at a time, the same address in every
 *     work-item: from local memory, copied there first (a broadcast), or with CF_CONST from a __constant argument;
 *   - each pixel's 27 inputs are loaded once (L1 serves the neighbours' overlap);
 *   - the stored values are staged in local memory, a pixel's row padded by 16 bytes (no bank conflicts), then the
 *     work-group's pixels, contiguous in NHWC, are written out 16 bytes a work-item (coalesced: one work-item's
 *     own row of 128 bytes written as 4-byte pairs was 4x slower than the whole layer on conv_tc.cl).
 *
 * CF_MMA = 1: the same layer on the tensor cores (mma.sync; MMA_EMULATE: mma.clh's software model). The taps are the
 * GEMM's k, in the same order, padded with zeros to whole k-steps (27 -> 32: 2 FP16 steps of 16, 4 TF32 steps of 8);
 * pixels are its rows, channels its columns. A warp takes 32 consecutive pixels (two m16 tiles) and every channel:
 *   - each lane builds its A fragments itself, gathering its rows' taps from the input (its k are 4t .. 4t + 3 and
 *     16 + 4t .. 16 + 4t + 3 bytes of each step, t = lane % 4: mma.clh's fragment layout), rounded as above: the
 *     taps' offsets found once per lane (cf_taps: a pixel row's tap is then a bounds check and a load), each FP16
 *     pair rounded by one conversion (f16x2_rn; 0.273 -> 0.200 ms at FP16, batch 64, H100);
 *   - the B fragments (the weights) come laid out by the host in fragment order (wt[((ks * NT + nt) * 2 + r) * 32 +
 *     lane], first_conv.mma_fragments): each lane reads its own registers once, coalesced, and keeps them;
 *   - the accumulators are staged and written out as above.
 * Emulated, the sums are the same fma chain in the same order as CF_MMA = 0's (zero products add nothing), so both
 * compute the same bytes; on the hardware, mma.sync's own accumulation may differ in the last bits of FP32.
 */

#ifndef CF_CIN
#define CF_CIN 3      /* input channels */
#endif
#ifndef CF_COUT
#define CF_COUT 64    /* output channels */
#endif
#ifndef CF_CSTORE
#define CF_CSTORE 64  /* channels per stored pixel: CF_COUT rounded up to 16 bytes of the output's storage */
#endif
#ifndef CF_WG
#define CF_WG 128     /* work-group size */
#endif
#ifndef CF_PIX
#define CF_PIX 1      /* pixels per work-item (CF_WG apart): each weight read serves CF_PIX of them */
#endif
#ifndef CF_CONST
#define CF_CONST 0    /* 1: the weights from a __constant argument (the constant bank) instead of local memory */
#endif
#ifndef CF_MMA
#define CF_MMA 0      /* 1: on the tensor cores (mma.sync), CF_PIX 1, CF_CONST 0 */
#endif
#ifndef TF32
#define TF32 0
#endif
#ifndef MMA_EMULATE
#define MMA_EMULATE 0
#endif
#define CF_TAPS (CF_CIN * 9)

#include "mma.clh"         /* out_t, STORE2_AS, to_tf32 */
#include "tc_epilogue.clh" /* TC_SCALED1 (8-bit output), RELU */

#if FP8 || INT8
#error "conv_first.cl: FP16 or TF32 input (an 8-bit model's first convolution is FP16)"
#endif

/* the input value as the storage type holds it */
inline float cf_round(float x) {
#if TF32
    return to_tf32(x);
#else
    ushort h;
    vstore_half_rte(x, 0, (__private half *)&h);
    return vload_half(0, (__private const half *)&h);
#endif
}

inline float cf_act(float v, __global const float *restrict bias,
#if OUT_EIGHT_BIT
                    const float out_scale_inv,
#endif
                    const int n) {
#if OUT_EIGHT_BIT
    return tc_scaled1(v, bias, bias, out_scale_inv, n);
#else
    return tc_act1(v, bias[n]);
#endif
}

#if OUT_EIGHT_BIT
#define CF_ACT(v, n) cf_act((v), bias, out_scale_inv, (n))
#else
#define CF_ACT(v, n) cf_act((v), bias, (n))
#endif

/* a pair of stored values into local memory, as STORE2 writes them to global */
#define CF_LSTORE2(p, i, v) STORE2_AS(__local, p, i, v)
#define CF_COUTP ((CF_COUT + 7) / 8 * 8)                  /* channels of a tap's weight row */
#define CF_ROW (CF_CSTORE + 16 / (int)sizeof(out_t))       /* out_t per staged pixel: 16 bytes of padding */
#define CF_CHUNKS (CF_CSTORE * (int)sizeof(out_t) / 16)   /* 16-byte chunks of a stored pixel */
#define CF_PIXELS (CF_WG * CF_PIX)                        /* pixels of a work-group */
#if CF_CONST
#define CF_W4(i) vload4((i), wt)                          /* 4 weights from the constant bank */
#else
#define CF_W4(i) wl[i]                                    /* 4 weights broadcast from local memory */
#endif

/* the 27 (9 CF_CIN) inputs of pixel p, rounded to the storage; zeros past NPIX */
__attribute__((always_inline)) inline void cf_gather(__global const float *restrict in, const int p, const int H, const int W, const int NPIX,
                      float *v) {
    if (p >= NPIX) {
#pragma unroll
        for (int t = 0; t < CF_TAPS; ++t) v[t] = 0.0f;
        return;
    }
    const int HW = H * W;
    const int b = p / HW, r = p - b * HW, y = r / W, x = r - (r / W) * W;
    __global const float *src = in + (size_t)b * CF_CIN * HW;
#pragma unroll
    for (int c = 0; c < CF_CIN; ++c)
#pragma unroll
        for (int ky = 0; ky < 3; ++ky)
#pragma unroll
            for (int kx = 0; kx < 3; ++kx) {
                const int yy = y + ky - 1, xx = x + kx - 1;
                const int inside = yy >= 0 && yy < H && xx >= 0 && xx < W;
                /* read at a clamped place (always inside the buffer), then zero the padding */
                const float at = src[(size_t)c * HW + clamp(yy, 0, H - 1) * W + clamp(xx, 0, W - 1)];
                v[(c * 3 + ky) * 3 + kx] = inside ? cf_round(at) : 0.0f;
            }
}

/* channels n, n + 1 of a staged pixel row: the sums s0, s1 through the epilogue (zero past CF_COUT), as stored */
#define CF_STAGE2(row, n, s0, s1)                                                                         \
    CF_LSTORE2((row), (n), ((float2)((n) < CF_COUT ? CF_ACT((s0), (n)) : 0.0f,                           \
                                     (n) + 1 < CF_COUT ? CF_ACT((s1), (n) + 1) : 0.0f)))

/* the end of either variant: the padding channels past the last block of 8 zeroed (the next layer reads them) in
 * this work-item's staged rows (lid + q CF_WG), then the work-group's pixels, contiguous in NHWC, written out 16
 * bytes a work-item */
inline void cf_write_out(__local uint4 *staged, __global out_t *restrict out, const int p0, const int NPIX,
                         const int lid) {
#pragma unroll
    for (int q = 0; q < CF_PIX; ++q)
#pragma unroll
        for (int n = CF_COUTP; n < CF_CSTORE; n += 2)
            CF_LSTORE2((__local out_t *)staged + (lid + q * CF_WG) * CF_ROW, n, ((float2)(0.0f, 0.0f)));
    barrier(CLK_LOCAL_MEM_FENCE);
    const int pixels = min(CF_PIXELS, NPIX - p0);
    __global uint4 *dst = (__global uint4 *)(out + (size_t)p0 * CF_CSTORE);
    for (int i = lid; i < pixels * CF_CHUNKS; i += CF_WG) {
        const int q = i / CF_CHUNKS, c = i - q * CF_CHUNKS;
        dst[i] = staged[q * (CF_ROW * (int)sizeof(out_t) / 16) + c];
    }
}

#if CF_MMA
#if CF_PIX != 1 || CF_CONST || CF_WG % 32
#error "conv_first.cl: CF_MMA takes one pixel a work-item, the weights as fragments, whole warps"
#endif
#define THREADS CF_WG
#define WARPS_M (CF_WG / 32)
#define WARPS_N 1
#define CF_KPS (32 / ELEM)                                 /* k of one mma step: 16 (FP16), 8 (TF32) */
#define CF_KSTEPS ((CF_TAPS + CF_KPS - 1) / CF_KPS)
#define CF_NT (CF_COUTP / 8)                               /* n8 tiles */
#define CF_PER (4 / ELEM)                                  /* k per register: 2 (FP16), 1 (TF32) */

/* a lane's taps: slot j = (ks, half_k, e) of its A registers holds tap k = ks CF_KPS + (16 half_k + 4 t) / ELEM + e
 * (t = lane % 4: mma.clh's fragment layout), the same for all its pixel rows; found once per work-item as the
 * offset of the tap's input from the pixel's own (c H W + dy W + dx) and its dy, dx, or dy = -H (never inside)
 * for a k past the taps */
#define CF_SLOTS (CF_KSTEPS * 2 * CF_PER)
typedef struct { int off[CF_SLOTS], dy[CF_SLOTS], dx[CF_SLOTS]; } cf_taps;

inline void cf_taps_of(cf_taps *t, const int t4, const int H, const int W) {
#pragma unroll
    for (int j = 0; j < CF_SLOTS; ++j) {
        const int e = j % CF_PER, half_k = (j / CF_PER) % 2, ks = j / (2 * CF_PER);
        const int k = ks * CF_KPS + (16 * half_k + 4 * t4) / ELEM + e;
        const int c = k / 9, dy = (k % 9) / 3 - 1, dx = k % 3 - 1;
        t->off[j] = (c * H + dy) * W + dx;
        t->dy[j] = k < CF_TAPS ? dy : -H;
        t->dx[j] = dx;
    }
}

/* slot j of the pixel at (y, x), whose own input is at `at` of `in` (zero in the padding, past the taps, or for a
 * pixel past NPIX: live 0) */
inline float cf_tap(__global const float *restrict in, const int at, const int y, const int x, const int H,
                    const int W, const int live, const cf_taps *t, const int j) {
    const int ok = live && (uint)(y + t->dy[j]) < (uint)H && (uint)(x + t->dx[j]) < (uint)W;
    return ok ? in[at + t->off[j]] : 0.0f;
}

/* register i = (ks, half_k) of a pixel row's A fragment: one TF32 value (cvt.rna), or two FP16 rounded to nearest
 * even in one conversion (f16x2_rn), the lower k in the low half */
inline uint cf_tap_bits(__global const float *restrict in, const int at, const int y, const int x, const int H,
                        const int W, const int live, const cf_taps *t, const int j0) {
#if TF32
    return as_uint(to_tf32(cf_tap(in, at, y, x, H, W, live, t, j0)));
#else
    return f16x2_rn(cf_tap(in, at, y, x, H, W, live, t, j0), cf_tap(in, at, y, x, H, W, live, t, j0 + 1));
#endif
}

#endif  /* CF_MMA */

__kernel __attribute__((reqd_work_group_size(CF_WG, 1, 1)))
void conv_first(__global const float *restrict in,      /* n x CF_CIN x H x W */
#if CF_MMA
                __global const uint *restrict wt,        /* B fragments: CF_KSTEPS x CF_NT x 2 x 32 lanes */
#elif CF_CONST
                __constant const float *restrict wt,     /* CF_TAPS x CF_COUTP, tap-major, rounded to the storage */
#else
                __global const float *restrict wt,       /* the same, copied to local memory first */
#endif
                __global const float *restrict bias,     /* CF_COUT (or more) */
#if OUT_EIGHT_BIT
                const float out_scale_inv,               /* 1 / s_out, the next layer's input scale */
#endif
                __global out_t *restrict out,            /* NHWC, CF_CSTORE channels */
                const int H, const int W, const int NPIX)
#if !CF_MMA
{
#if !CF_CONST
    __local float4 wl[CF_TAPS * CF_COUTP / 4];
#endif
    __local uint4 staged[CF_PIXELS * CF_ROW * sizeof(out_t) / 16];
    const int lid = get_local_id(0), p0 = get_group_id(0) * CF_PIXELS;
#if !CF_CONST
    for (int i = lid; i < CF_TAPS * CF_COUTP / 4; i += CF_WG) wl[i] = vload4(i, wt);
#endif
    /* this work-item's pixels: p0 + lid + q CF_WG, q < CF_PIX */
    float v[CF_PIX][CF_TAPS];
#pragma unroll
    for (int q = 0; q < CF_PIX; ++q) cf_gather(in, p0 + lid + q * CF_WG, H, W, NPIX, v[q]);
    barrier(CLK_LOCAL_MEM_FENCE);
#pragma unroll
    for (int n0 = 0; n0 < CF_COUTP; n0 += 8) {
        float4 a[CF_PIX], b[CF_PIX];
#pragma unroll
        for (int q = 0; q < CF_PIX; ++q) a[q] = b[q] = (float4)(0.0f);
#pragma unroll
        for (int t = 0; t < CF_TAPS; ++t) {
            const float4 wa = CF_W4((t * CF_COUTP + n0) / 4), wb = CF_W4((t * CF_COUTP + n0) / 4 + 1);
#pragma unroll
            for (int q = 0; q < CF_PIX; ++q) {
                a[q] = fma((float4)(v[q][t]), wa, a[q]);
                b[q] = fma((float4)(v[q][t]), wb, b[q]);
            }
        }
#pragma unroll
        for (int q = 0; q < CF_PIX; ++q) {
            __local out_t *row = (__local out_t *)staged + (lid + q * CF_WG) * CF_ROW;
            const float acc[8] = {a[q].x, a[q].y, a[q].z, a[q].w, b[q].x, b[q].y, b[q].z, b[q].w};
#pragma unroll
            for (int j = 0; j < 8; j += 2)
                if (n0 + j < CF_CSTORE) CF_STAGE2(row, n0 + j, acc[j], acc[j + 1]);
        }
    }
    cf_write_out(staged, out, p0, NPIX, lid);
}

#else  /* CF_MMA */
{
    MMA_WARPS(xch, 6)
    __local uint4 staged[CF_PIXELS * CF_ROW * sizeof(out_t) / 16];
    const int g = lane >> 2, t4 = lane & 3;
    const int p0 = get_group_id(0) * CF_PIXELS;
    uint bf[CF_KSTEPS][CF_NT][2];
#pragma unroll
    for (int ks = 0; ks < CF_KSTEPS; ++ks)
#pragma unroll
        for (int nt = 0; nt < CF_NT; ++nt)
#pragma unroll
            for (int r = 0; r < 2; ++r) bf[ks][nt][r] = wt[((ks * CF_NT + nt) * 2 + r) * 32 + lane];
    /* this lane's four pixel rows: warp * 32 + mi * 16 + g + 8 h; their A registers, every k-step */
    cf_taps taps;
    cf_taps_of(&taps, t4, H, W);
    uint af[CF_KSTEPS][2][4];
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int p = p0 + warp * 32 + mi * 16 + g + 8 * h;
            const int HW = H * W, live = p < NPIX;
            const int b = p / HW, rest = p - b * HW, y = rest / W, x = rest - y * W;
            const int at = b * CF_CIN * HW + rest;  /* the pixel's channel 0 (int: inputs under 2^31 floats) */
#pragma unroll
            for (int ks = 0; ks < CF_KSTEPS; ++ks)
#pragma unroll
                for (int half_k = 0; half_k < 2; ++half_k)
                    af[ks][mi][h + 2 * half_k] = cf_tap_bits(in, at, y, x, H, W, live, &taps,
                                                             (ks * 2 + half_k) * CF_PER);
        }
    MMA_ACC(acc, 2, CF_NT)
    MMA_UNROLL for (int ks = 0; ks < CF_KSTEPS; ++ks)
    MMA_UNROLL for (int mi = 0; mi < 2; ++mi)
    MMA_UNROLL for (int nt = 0; nt < CF_NT; ++nt) MMA(acc[mi][nt], af[ks][mi], bf[ks][nt]);
    /* the stored values into local memory: rows are the work-group's pixels */
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            __local out_t *row = (__local out_t *)staged + (warp * 32 + mi * 16 + g + 8 * h) * CF_ROW;
#pragma unroll
            for (int nt = 0; nt < CF_NT; ++nt) {
                const int n = nt * 8 + 2 * t4;
                if (n < CF_CSTORE) CF_STAGE2(row, n, acc[mi][nt][2 * h], acc[mi][nt][2 * h + 1]);
            }
        }
    cf_write_out(staged, out, p0, NPIX, tid);
}
#endif
