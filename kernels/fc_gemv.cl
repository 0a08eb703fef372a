/* fc_gemv.cl -- fully connected layers at small batch (1 .. GEMV_NB): matrix-vector products, bandwidth-bound.
 *
 *   y[b, m] = act(bias[m] + sum_k W[m, k] * x[b, k]),   b < NB
 * Weights use the same re-laid layout as conv_gemm.cl: wt[k * Mpad + m] (K x Mpad, zero padded), so one copy
 * serves both paths. Work-item (lm, lk) of a GEMV_LM x GEMV_LK work-group owns the GEMV_WM consecutive outputs
 * m = mb + v, mb = m0 + lm * GEMV_WM, and walks k = kbeg + lk, kbeg + lk + GEMV_LK, ... up to the chunk's end.
 *   GPUs: GEMV_WM = 1, so for each k the GEMV_LM work-items of a row read consecutive floats (coalesced).
 *   CPUs: GEMV_WM = 16, so each work-item's inner loop is one 16-wide load and FMA on a whole cache line
 *         (PoCL runs a work-item's loop as scalar code; vector width has to come from inside the work-item).
 * x[b, k] is the same for the whole row (broadcast).
 * Work-group (gm, gk) covers outputs m0 = gm * GEMV_LM * GEMV_WM and the K chunk [gk * kchunk, (gk+1) * kchunk):
 * split K fills the device even for 1000 outputs. The GEMV_LK partial sums are reduced in local memory and
 * written to part[(gk * NB + b) * Mpad + m]; fc_reduce adds the chunks, the bias and the activation.
 * Mpad must be a multiple of GEMV_LM * GEMV_WM (the host pads the weights so).
 */

#ifndef GEMV_LM
#define GEMV_LM 64  /* work-items per work-group along M, e.g. 16, 32, 64 */
#endif
#ifndef GEMV_LK
#define GEMV_LK 4   /* work-items sharing one output's K range, e.g. 1, 2, 4, 8 */
#endif
#ifndef GEMV_WM
#define GEMV_WM 1   /* consecutive outputs per work-item: 1 on GPUs, 8 or 16 on CPUs */
#endif
#ifndef GEMV_NB
#define GEMV_NB 4   /* largest batch handled by this path (register accumulators per work-item) */
#endif
#ifndef RELU
#define RELU 1
#endif

#include "storage.clh"  /* x: in_t, wt: w_t, y: out_t (FP32 or FP16 storage) */

#define GEMV_SPAN (GEMV_LM * GEMV_WM)  /* outputs per work-group */

__kernel __attribute__((reqd_work_group_size(GEMV_LM, GEMV_LK, 1)))
void fc_gemv(__global const in_t *restrict x,   /* NB x K */
             __global const w_t *restrict wt,    /* K x Mpad */
             __global float *restrict part,      /* KSPLIT x NB x Mpad partial sums */
             const int K, const int Mpad, const int NB, const int kchunk)
{
    const int lm = get_local_id(0), lk = get_local_id(1);
    const int mb = get_group_id(0) * GEMV_SPAN + lm * GEMV_WM;
    const int gk = get_group_id(1);
    const int kbeg = gk * kchunk;
    const int kend = min(K, kbeg + kchunk);
    float acc[GEMV_NB][GEMV_WM];
    for (int b = 0; b < GEMV_NB; ++b)
        for (int v = 0; v < GEMV_WM; ++v) acc[b][v] = 0.0f;
    for (int k = kbeg + lk; k < kend; k += GEMV_LK) {
        const size_t row = (size_t)k * Mpad + mb;
        float w[GEMV_WM];
        for (int v = 0; v < GEMV_WM; ++v) w[v] = LD_W(wt, row + v);
        for (int b = 0; b < GEMV_NB; ++b) {
            if (b < NB) {
                const float xv = LD_IN(x, (size_t)b * K + k);
                for (int v = 0; v < GEMV_WM; ++v) acc[b][v] = fma(w[v], xv, acc[b][v]);
            }
        }
    }
#if GEMV_LK == 1
    for (int b = 0; b < GEMV_NB; ++b) {
        if (b >= NB) break;
        for (int v = 0; v < GEMV_WM; ++v) part[((size_t)gk * NB + b) * Mpad + mb + v] = acc[b][v];
    }
#else
    __local float red[GEMV_LK][GEMV_SPAN];
    for (int b = 0; b < GEMV_NB; ++b) {
        if (b >= NB) break;  /* uniform across the work-group */
        for (int v = 0; v < GEMV_WM; ++v) red[lk][lm * GEMV_WM + v] = acc[b][v];
        barrier(CLK_LOCAL_MEM_FENCE);
        if (lk == 0) {
            for (int v = 0; v < GEMV_WM; ++v) {
                float s = 0.0f;
                for (int j = 0; j < GEMV_LK; ++j) s += red[j][lm * GEMV_WM + v];
                part[((size_t)gk * NB + b) * Mpad + mb + v] = s;
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
#endif
}

/* y[b * M + m] = act(bias[m] + sum_gk part[(gk * NB + b) * Mpad + m]); one work-item per (b, m), guarded. */
__kernel void fc_reduce(__global const float *restrict part, __global const float *restrict bias,
                        __global out_t *restrict y, const int M, const int Mpad, const int NB, const int ksplit)
{
    const int idx = get_global_id(0);
    if (idx >= NB * M) return;
    const int b = idx / M, m = idx - (idx / M) * M;
    float s = bias[m];
    for (int g = 0; g < ksplit; ++g) s += part[((size_t)g * NB + b) * Mpad + m];
#if RELU
    s = fmax(s, 0.0f);
#endif
    ST_OUT(y, idx, s);
}
