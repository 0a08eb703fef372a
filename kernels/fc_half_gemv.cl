/* fc_half_gemv.cl -- the tensor-core family's fully connected layers at small batch (tc_gemv): FP16 matrix-vector
 * products on plain OpenCL C (no mma), bound by the weights' bandwidth, for the NHWC activations conv_tc.cl writes.
 *
 *   out[b, m] = act( bias[m] + sum_k Wt[m, k] * in[b, k] )     FP32 sums of FP16 products
 *   in:   n images of Kpad FP16 features (the previous layer's Cstore channels: a multiple of 8, padding zero)
 *                                                                                   in[b * Kpad + k]
 *   wt:   Mpad x Kpad FP16, k contiguous (conv_tc.cl's "OHWI" rows; zero past the layer's outputs and inputs)
 *                                                                                   wt[m * Kpad + k]
 *   bias: Mpad floats, zero past the layer's outputs
 *   out:  n images of Cstore outputs: FP16 (the next layer's input), or float (OUT_F32: the logits)
 *                                                                                   out[b * Cstore + m]
 * Outputs m in [M, Cstore) are written as act(0 + 0) = 0 (the padding channels the next layer reads), as conv_tc.cl
 * writes them; Mpad >= Cstore, a multiple of ROWS.
 *
 * Work-group (gm, gb) computes ROWS consecutive outputs m0 = gm * ROWS .. m0 + ROWS - 1 for images
 * b0 = gb * NB .. b0 + nb - 1 (nb = min(NB, n - b0)): every one of its WG work-items walks the 16-byte pieces
 * p = lid, lid + WG, ... of those ROWS weight rows (so a warp reads 512 consecutive bytes of a row: coalesced), loads
 * the matching piece of each image's input once for the ROWS rows, and keeps ROWS x NB sums; a tree in local memory
 * then adds the WG work-items' sums. Each piece's 8 products are added into the sum by a chain of fma (exact
 * products of FP16 values: only the sums round). Pieces are 16-byte aligned (Kpad is a multiple of 8), so a GPU can
 * issue one 16-byte load per piece: LD16 = 0 reads them by vloada_half8 (the aligned vector load of halves), LD16 = 1
 * as a uint4 converted from a private copy (vload_half8 of its bytes), in case a compiler splits the first into
 * narrower loads. Images past NB are further work-groups along dimension 1 (each reads the weights again: the entry
 * is meant for n <= NB, where the weights are streamed exactly once).
 *
 * TC = 1: the products on the tensor cores instead (mma.sync m16n8k16, FP32 sums; gemv_mma.clh): ROWS = 8 outputs a
 * work-group for up to NB = 8 images, its WG / 32 warps splitting K in blocks of 64 bytes, the weights loaded as B
 * fragments with no conversion (the CUDA cores' form converts every weight to FP32); the weights' rows are then
 * Kpad rounded up to 32 (64 bytes), zero past the inputs. The warps' FP32 sums meet in local memory, in warp order.
 */

#ifndef WG
#define WG 256      /* work-items per work-group (a power of 2) */
#endif
#ifndef ROWS
#define ROWS 4      /* outputs per work-group */
#endif
#ifndef NB
#define NB 8        /* images per work-group (register sums: ROWS x NB per work-item) */
#endif
#ifndef LD16
#define LD16 0      /* 1: pieces loaded as uint4 and converted from private memory, else vloada_half8 */
#endif
#ifndef RELU
#define RELU 1
#endif
#ifndef OUT_F32
#define OUT_F32 0   /* 1: float outputs (the logits), else FP16 */
#endif
#ifndef TC
#define TC 0        /* 1: the products on the tensor cores, mma.sync (ROWS 8, NB at most 8; above) */
#endif

#if (WG & (WG - 1)) != 0 || WG < 1
#error "WG must be a power of 2"
#endif
#if TC
#include "gemv_mma.clh"     /* gemv_mma_sums: the products on mma.sync (m16n8k16 FP16) */
#else
#include "gemv_reduce.clh"   /* GEMV_REDUCE: the work-items' sums added by a tree in local memory */

/* piece p (8 halves, 16-byte aligned) of a row, as floats */
inline float8 piece(__global const half *row, int p) {
#if LD16
    const uint4 u = ((__global const uint4 *)row)[p];
    return vload_half8(0, (const __private half *)&u);
#else
    return vloada_half8(p, row);
#endif
}

/* a + sum of w * x, one fma per product */
inline float dot8(float8 w, float8 x, float a) {
    a = fma(w.s0, x.s0, a);
    a = fma(w.s1, x.s1, a);
    a = fma(w.s2, x.s2, a);
    a = fma(w.s3, x.s3, a);
    a = fma(w.s4, x.s4, a);
    a = fma(w.s5, x.s5, a);
    a = fma(w.s6, x.s6, a);
    return fma(w.s7, x.s7, a);
}

#endif  /* !TC */

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void fc_half_gemv(__global const half *restrict in, __global const half *restrict wt,
                  __global const float *restrict bias,
#if OUT_F32
                  __global float *restrict out,
#else
                  __global half *restrict out,
#endif
                  const int Kpad, const int Cstore, const int n)
{
#if TC
    MMA_WARPS(xch, 6)
    __local float red[WARPS_M * 64];   /* [warp][image g][output n] */
    const int lid = tid;
    const int m0 = get_group_id(0) * ROWS;
    const int b0 = get_group_id(1) * NB;
    const int nb = min(NB, n - b0);
    gemv_mma_sums(red, (__global const uchar *)(in + (size_t)b0 * Kpad), (__global const uchar *)wt, 2 * Kpad, m0,
                  nb, lane, warp, GEMV_MMA_XCH);
    barrier(CLK_LOCAL_MEM_FENCE);
#define GEMV_SUM(v) gemv_mma_total(red, (v))
#else
    __local float red[ROWS * NB * WG];
    const int lid = get_local_id(0);
    const int m0 = get_group_id(0) * ROWS;
    const int b0 = get_group_id(1) * NB;
    const int nb = min(NB, n - b0);
    const int pieces = Kpad / 8;
    __global const half *w0 = wt + (size_t)m0 * Kpad;
    __global const half *x0 = in + (size_t)b0 * Kpad;
    float acc[ROWS][NB];
    for (int r = 0; r < ROWS; ++r)
        for (int b = 0; b < NB; ++b) acc[r][b] = 0.0f;
    for (int p = lid; p < pieces; p += WG) {
        float8 w[ROWS];
        for (int r = 0; r < ROWS; ++r) w[r] = piece(w0 + (size_t)r * Kpad, p);
        for (int b = 0; b < NB; ++b) {
            if (b < nb) {
                const float8 x = piece(x0 + (size_t)b * Kpad, p);
                for (int r = 0; r < ROWS; ++r) acc[r][b] = dot8(w[r], x, acc[r][b]);
            }
        }
    }
    GEMV_REDUCE(red, acc, lid, nb)  /* value v = b * ROWS + r of the group at red[v * WG] */
#define GEMV_SUM(v) red[(v) * WG]
#endif
    if (lid < ROWS * nb) {
        const int b = lid / ROWS, r = lid - b * ROWS, m = m0 + r;
        if (m < Cstore) {
            float y = GEMV_SUM(lid) + bias[m];
#if RELU
            y = fmax(y, 0.0f);
#endif
#if OUT_F32
            out[(size_t)(b0 + b) * Cstore + m] = y;
#else
            vstore_half_rte(y, (size_t)(b0 + b) * Cstore + m, out);
#endif
        }
    }
}
