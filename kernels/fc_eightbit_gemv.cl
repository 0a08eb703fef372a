/* fc_eightbit_gemv.cl -- the tensor-core family's 8-bit fully connected layers at small batch (tc_gemv8): matrix-vector
 * products of 8-bit codes on the CUDA cores (TC = 0) or on mma.sync (TC = 1, below), bound by the weights' bandwidth:
 * one byte a weight, half of fc_half_gemv.cl's. It reads and writes what conv_tc.cl's FC layers read and write at
 * FP8 or INT8 (ops/eightbit.py):
 *
 *   INT8:  out[b, m] = act( (float)(sum_k Wq[m, k] * Xq[b, k]) * cs[m] + bias[m] )   int32 sums, exact
 *   FP8:   out[b, m] = act( (sum_k Wq[m, k] * Xq[b, k]) * cs[m] + bias[m] )          FP32 sums of exact products
 *   in:    n images of Kpad codes (u8 for INT8, e4m3 for FP8; a multiple of 16, padding 0)   in[b * Kpad + k]
 *   wt:    Mpad x Kpad codes (s8 or e4m3), k contiguous, zero past the layer's outputs and inputs   wt[m * Kpad + k]
 *          (TC = 1: rows of Kw = Kpad rounded up to 64 bytes)
 *   bias:  Mpad floats, zero past the layer's outputs; cs: Mpad floats (s_in * s_w[m]; 1 past them)
 *   out:   n images of Cstore outputs: the next layer's codes of y * out_scale_inv (OUT_INT8: u8, OUT_FP8: e4m3),
 *          FP16, or float (OUT_F32: the logits)                                               out[b * Cstore + m]
 * The epilogue is conv_tc.cl's (tc_epilogue.clh's TC_SCALED1): y = fma(sum, cs[m], bias[m]), ReLU as y > 0 ? y : +0,
 * then the scale and the store's rounding, so an INT8 layer's outputs are tc_gemm's bit for bit (both sums are the
 * exact integer). Outputs m in [M, Cstore) are written as 0, as conv_tc.cl writes them.
 *
 * Work-group (gm, gb) computes ROWS consecutive outputs m0 = gm * ROWS .. for images b0 = gb * NB .. b0 + nb - 1
 * (nb = min(NB, n - b0)). Each of its WG work-items walks the 16-byte pieces p = lid, lid + WG, ... of those ROWS
 * weight rows (a warp reads 512 consecutive bytes of a row), loads the matching piece of each image once, and keeps
 * ROWS x NB sums, which a tree in local memory then adds.
 *   INT8: a piece is 4 words of 4 codes; each word pair is one 4-way dot product of u8 x s8 bytes added to an int
 *         (dp4a.u32.s32 natively, its byte arithmetic when MMA_EMULATE): exact, in any order.
 *   FP8:  each word of codes is decoded to 4 floats (cvt.rn.f16x2.e4m3x2 and cvt.f32.f16 natively, e4m3.clh's
 *         e4m3_decode when MMA_EMULATE; both exact), the weights' once for all the images; every product of two
 *         e4m3 values is exact in FP32 (4 x 4 significant bits), the sums are a chain of fma in a fixed order, so the
 *         emulated and the native kernel give the same bits.
 *
 * TC = 1: the products on the tensor cores instead (mma.sync m16n8k32, mma.clh: u8 x s8 with int32 sums, or
 * e4m3 x e4m3 with FP32 sums), for FP8, where the CUDA cores' conversions may bound the kernel below the memory's
 * bandwidth: gemv_mma.clh, a work-group of ROWS = 8 outputs for up to NB = 8 images, its WG / 32 warps splitting K,
 * the weights loaded as B fragments with no conversion. The sums are INT8's exact integers (the same as TC = 0) or
 * FP32 sums in another order. The warps' sums meet in local memory, added in warp order.
 */

#ifndef WG
#define WG 256      /* work-items per work-group (a power of 2) */
#endif
#ifndef ROWS
#define ROWS 4      /* outputs per work-group */
#endif
#ifndef NB
#define NB 4        /* images per work-group (register sums: ROWS x NB per work-item) */
#endif
#ifndef RELU
#define RELU 1
#endif
#ifndef FP8
#define FP8 0
#endif
#ifndef INT8
#define INT8 0
#endif
#ifndef OUT_FP8
#define OUT_FP8 0   /* 1: e4m3 codes out */
#endif
#ifndef OUT_INT8
#define OUT_INT8 0  /* 1: u8 codes out */
#endif
#ifndef OUT_F32
#define OUT_F32 0   /* 1: float outputs (the logits); with none of the three, FP16 */
#endif
#ifndef MMA_EMULATE
#define MMA_EMULATE 0
#endif
#ifndef TC
#define TC 0        /* 1: the products on the tensor cores, mma.sync (ROWS 8, NB at most 8; above) */
#endif

#if (WG & (WG - 1)) != 0 || WG < 1
#error "WG must be a power of 2"
#endif
#if FP8 == INT8
#error "exactly one of FP8 and INT8"
#endif
#if (OUT_FP8 && INT8) || (OUT_INT8 && FP8) || (OUT_FP8 + OUT_INT8 + OUT_F32 > 1)
#error "the codes out are the codes in; at most one output storage"
#endif
#if TC
#include "gemv_mma.clh"     /* gemv_mma_sums: the products on mma.sync (mma.clh, which includes e4m3.clh) */
#else
#include "e4m3.clh"
#define OUT_EIGHT_BIT (OUT_FP8 || OUT_INT8)
#endif
#include "gemv_reduce.clh"   /* GEMV_REDUCE: the work-items' sums added by a tree in local memory */

#if INT8
typedef int sum_t;
#else
typedef float sum_t;
#endif

/* the epilogue of output m of image (row of out) b: y = fma(sum, cs[m], bias[m]) (INT8: the int sum rounded to
 * nearest even first), ReLU, the scale to the next layer's codes, the store's rounding */
#if OUT_F32
#define GEMV_OUT_T float
#elif OUT_EIGHT_BIT
#define GEMV_OUT_T uchar
#else
#define GEMV_OUT_T half
#endif
inline void store_out(__global GEMV_OUT_T *restrict out, sum_t sum, __global const float *restrict bias,
                      __global const float *restrict cs, float out_scale_inv, int Cstore, int b, int m) {
    float y = fma((float)sum, cs[m], bias[m]);
#if RELU
    y = y > 0.0f ? y : 0.0f;
#endif
    const size_t o = (size_t)b * Cstore + m;
#if OUT_EIGHT_BIT
    y *= out_scale_inv;
#endif
#if OUT_F32
    out[o] = y;
#elif OUT_INT8
    out[o] = convert_uchar_sat_rte(y);
#elif OUT_FP8
    out[o] = (uchar)e4m3_encode(y);
#else
    vstore_half_rte(y, o, out);
#endif
}

#if !TC
#if INT8
/* a + the four products of x's u8 bytes with w's s8 bytes (byte j with byte j) */
inline int dot4(uint x, uint w, int a) {
#if MMA_EMULATE
    const uchar4 u = as_uchar4(x);
    const char4 s = as_char4(w);
    return a + (int)u.x * s.x + (int)u.y * s.y + (int)u.z * s.z + (int)u.w * s.w;
#else
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(x), "r"(w), "r"(a));
    return d;
#endif
}
#else
/* the four e4m3 codes of a word as floats, byte 0 in .x (exact) */
inline float4 e4m3x4(uint w) {
#if MMA_EMULATE
    return (float4)(e4m3_decode(w & 255u), e4m3_decode((w >> 8) & 255u), e4m3_decode((w >> 16) & 255u),
                    e4m3_decode(w >> 24));
#else
    float4 f;
    asm("{\n.reg .b16 l, h, a, b, c, d;\n.reg .b32 p, q;\n"
        "mov.b32 {l, h}, %4;\n"
        "cvt.rn.f16x2.e4m3x2 p, l;\ncvt.rn.f16x2.e4m3x2 q, h;\n"
        "mov.b32 {a, b}, p;\nmov.b32 {c, d}, q;\n"
        "cvt.f32.f16 %0, a;\ncvt.f32.f16 %1, b;\ncvt.f32.f16 %2, c;\ncvt.f32.f16 %3, d;\n}\n"
        : "=f"(f.x), "=f"(f.y), "=f"(f.z), "=f"(f.w) : "r"(w));
    return f;
#endif
}
/* a + w . x, one fma per product in the order x, y, z, w */
inline float dot4f(float4 w, float4 x, float a) {
    a = fma(w.x, x.x, a);
    a = fma(w.y, x.y, a);
    a = fma(w.z, x.z, a);
    return fma(w.w, x.w, a);
}
#endif

/* word j (0 .. 3) of a piece */
inline uint word(uint4 v, int j) {
    return j == 0 ? v.s0 : j == 1 ? v.s1 : j == 2 ? v.s2 : v.s3;
}


#endif  /* !TC */

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void fc_eightbit_gemv(__global const uchar *restrict in, __global const uchar *restrict wt,
                      __global const float *restrict bias, __global const float *restrict cs,
#if OUT_EIGHT_BIT
                      const float out_scale_inv,
#endif
                      __global GEMV_OUT_T *restrict out, const int Kpad, const int Cstore, const int n)
{
#if !OUT_EIGHT_BIT
    const float out_scale_inv = 1.0f;  /* not used */
#endif
#if TC
    MMA_WARPS(xch, 6)
    __local sum_t red[WARPS_M * 64];   /* [warp][image g][output n] */
    const int lid = tid;
    const int m0 = get_group_id(0) * ROWS;
    const int b0 = get_group_id(1) * NB;
    const int nb = min(NB, n - b0);
    gemv_mma_sums(red, in + (size_t)b0 * Kpad, wt, Kpad, m0, nb, lane, warp, GEMV_MMA_XCH);
    barrier(CLK_LOCAL_MEM_FENCE);
#define GEMV_SUM(v) gemv_mma_total(red, (v))
#else
    __local sum_t red[ROWS * NB * WG];
    const int lid = get_local_id(0);
    const int m0 = get_group_id(0) * ROWS;
    const int b0 = get_group_id(1) * NB;
    const int nb = min(NB, n - b0);
    const int pieces = Kpad / 16;
    __global const uint4 *w0 = (__global const uint4 *)(wt + (size_t)m0 * Kpad);
    __global const uint4 *x0 = (__global const uint4 *)(in + (size_t)b0 * Kpad);
    sum_t acc[ROWS][NB];
    for (int r = 0; r < ROWS; ++r)
        for (int b = 0; b < NB; ++b) acc[r][b] = 0;
    for (int p = lid; p < pieces; p += WG) {
        uint4 w[ROWS], x[NB];
        for (int r = 0; r < ROWS; ++r) w[r] = w0[(size_t)r * pieces + p];
        for (int b = 0; b < NB; ++b) x[b] = b < nb ? x0[(size_t)b * pieces + p] : (uint4)(0u);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
#if INT8
            for (int b = 0; b < NB; ++b)
                for (int r = 0; r < ROWS; ++r) acc[r][b] = dot4(word(x[b], j), word(w[r], j), acc[r][b]);
#else
            float4 wf[ROWS];
            for (int r = 0; r < ROWS; ++r) wf[r] = e4m3x4(word(w[r], j));
            for (int b = 0; b < NB; ++b) {
                if (b < nb) {
                    const float4 xf = e4m3x4(word(x[b], j));
                    for (int r = 0; r < ROWS; ++r) acc[r][b] = dot4f(wf[r], xf, acc[r][b]);
                }
            }
#endif
        }
    }
    GEMV_REDUCE(red, acc, lid, nb)  /* value v = b * ROWS + r of the group at red[v * WG] */
#define GEMV_SUM(v) red[(v) * WG]
#endif
    if (lid < ROWS * nb) {
        const int b = lid / ROWS, r = lid - b * ROWS;
        if (m0 + r < Cstore) store_out(out, GEMV_SUM(lid), bias, cs, out_scale_inv, Cstore, b0 + b, m0 + r);
    }
}
