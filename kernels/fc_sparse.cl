/* fc_sparse.cl -- fully connected layers over pruned weights in CSR: only the non-zeros and their positions are read.
 *
 *   y[b, m] = act(bias[m] + sum over the non-zero W[m, k] of W[m, k] * x[b, k])
 * Weights (host side: vggserve/ops/sparse_fc.py), CSR by output row m:
 *   row m's non-zeros are entries [rowptr[m], rowptr[m+1]) of  cols[] (their k; 16-bit when K <= 65536, see SP_COL16)
 *   and vals[] (float32), in increasing k.  Bytes read per non-zero: 4 + 2 (or 4); dense reads 4 per weight, so at
 *   90% sparsity the weights take 0.15x (16-bit columns) of the dense bytes.
 *
 * fc_spmv -- small batches (n <= SPMV_NB; batch 1 is the case that matters): a GEMV that streams the weights once.
 *   Work-group: SPMV_LK lanes along one row's non-zeros (dimension 0) x SPMV_LM rows (dimension 1). Lane l of row m
 *   sums entries rowptr[m] + l, + SPMV_LK, ... for every image b < n (SPMV_NB accumulators), the lanes' sums are
 *   added in local memory in lane order, and lane 0 stores act(bias + sum). GPUs: SPMV_LK = 32 (a warp reads a
 *   row's entries contiguously); CPUs: SPMV_LK = 1 (a work-item walks its whole row).
 * fc_transpose + fc_spmm -- larger batches: x (n x K, row-major) is first transposed to xt (K x NP, NP = n rounded up
 *   to SPMM_NV), so that the images' values of one k are contiguous; then work-item (batch block i, row m) keeps a
 *   vector of SPMM_NV images' sums and, for each non-zero (k, w) of row m, adds w * xt[k, i*SPMM_NV .. +SPMM_NV).
 *   Dimension 0 runs over batch blocks, so the SPMM_WG work-items of a work-group share the row's weights
 *   (broadcast) and read consecutive images (coalesced). GPUs: SPMM_NV = 1, SPMM_WG = 32..64; CPUs: SPMM_NV = 8 or
 *   16 (one SIMD register), SPMM_WG = 1.
 * Every output sums its row's non-zeros in increasing k (fc_spmv: per lane, then the lanes in order).
 */

#ifndef SPMV_LM
#define SPMV_LM 4     /* rows per fc_spmv work-group */
#endif
#ifndef SPMV_LK
#define SPMV_LK 32    /* lanes per row in fc_spmv: 1 (CPU) .. 32 (GPU) */
#endif
#ifndef SPMV_NB
#define SPMV_NB 4     /* largest batch of fc_spmv (accumulators per lane) */
#endif
#ifndef SPMM_NV
#define SPMM_NV 1     /* images per fc_spmm work-item (vector width): 1, 2, 4, 8, 16 */
#endif
#ifndef SPMM_WG
#define SPMM_WG 64    /* fc_spmm work-items per work-group, along the batch blocks */
#endif
#ifndef TR_WG
#define TR_WG 64      /* fc_transpose work-group size */
#endif
#ifndef SP_COL16
#define SP_COL16 1    /* 1: column indices are ushort (K <= 65536), 0: uint */
#endif
#ifndef RELU
#define RELU 1
#endif

#if SP_COL16
typedef ushort col_t;
#else
typedef uint col_t;
#endif
#if RELU
#define FC_ACT(z) fmax((z), 0.0f)
#else
#define FC_ACT(z) (z)
#endif

__kernel __attribute__((reqd_work_group_size(SPMV_LK, SPMV_LM, 1)))
void fc_spmv(__global const float *restrict x,       /* n x K */
             __global const int *restrict rowptr,    /* M + 1 */
             __global const col_t *restrict cols,    /* nnz */
             __global const float *restrict vals,    /* nnz */
             __global const float *restrict bias,    /* M */
             __global float *restrict y,             /* n x M */
             const int K, const int M, const int n)
{
    const int lane = get_local_id(0), r = get_local_id(1);
    const int m = get_group_id(1) * SPMV_LM + r;
    float acc[SPMV_NB];
    for (int b = 0; b < SPMV_NB; ++b) acc[b] = 0.0f;
    if (m < M) {
        const int end = rowptr[m + 1];
        for (int e = rowptr[m] + lane; e < end; e += SPMV_LK) {
            const float w = vals[e];
            const int k = cols[e];
            for (int b = 0; b < SPMV_NB; ++b) {
                if (b < n) acc[b] = fma(w, x[(size_t)b * K + k], acc[b]);
            }
        }
    }
#if SPMV_LK == 1
    if (m < M) {
        for (int b = 0; b < n && b < SPMV_NB; ++b) y[(size_t)b * M + m] = FC_ACT(acc[b] + bias[m]);
    }
#else
    __local float red[SPMV_LM][SPMV_LK];
    for (int b = 0; b < SPMV_NB; ++b) {
        if (b >= n) break;  /* uniform across the work-group */
        red[r][lane] = acc[b];
        barrier(CLK_LOCAL_MEM_FENCE);
        if (lane == 0 && m < M) {
            float s = 0.0f;
            for (int l = 0; l < SPMV_LK; ++l) s += red[r][l];
            y[(size_t)b * M + m] = FC_ACT(s + bias[m]);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
#endif
}

/* xt[k * NP + b] = x[b * K + k] for b < n (the columns n .. NP-1 are left as they are: their sums are never stored) */
__kernel __attribute__((reqd_work_group_size(TR_WG, 1, 1)))
void fc_transpose(__global const float *restrict x, __global float *restrict xt, const int K, const int n,
                  const int NP)
{
    const int k = get_global_id(0), b = get_global_id(1);
    if (k < K) xt[(size_t)k * NP + b] = x[(size_t)b * K + k];
}

#define FC_CAT_(a, b) a##b
#define FC_CAT(a, b) FC_CAT_(a, b)
#if SPMM_NV == 1
typedef float fvec;
#define FC_VLOAD(p) (*(p))
#else
typedef FC_CAT(float, SPMM_NV) fvec;
#define FC_VLOAD(p) FC_CAT(vload, SPMM_NV)(0, (p))
#endif

__kernel __attribute__((reqd_work_group_size(SPMM_WG, 1, 1)))
void fc_spmm(__global const float *restrict xt,      /* K x NP */
             __global const int *restrict rowptr,
             __global const col_t *restrict cols,
             __global const float *restrict vals,
             __global const float *restrict bias,
             __global float *restrict y,             /* n x M */
             const int M, const int n, const int NP)
{
    const int b0 = get_global_id(0) * SPMM_NV;
    const int m = get_global_id(1);
    if (b0 >= NP || m >= M) return;
    fvec acc = (fvec)(0.0f);
    const int end = rowptr[m + 1];
    for (int e = rowptr[m]; e < end; ++e)
        acc = fma((fvec)(vals[e]), FC_VLOAD(xt + (size_t)cols[e] * NP + b0), acc);
    float a[SPMM_NV];
#if SPMM_NV == 1
    a[0] = acc;
#else
    FC_CAT(vstore, SPMM_NV)(acc, 0, a);
#endif
    const float bm = bias[m];
    for (int i = 0; i < SPMM_NV; ++i) {
        if (b0 + i < n) y[(size_t)(b0 + i) * M + m] = FC_ACT(a[i] + bm);
    }
}
