/* conv_gemm.cl -- convolution as an implicit, padded GEMM (im2col folded into the local-memory loads).
 *
 *   out[b, m, y, x] = act( bias[m] + sum_k  W[m, k] * col[k, p] ),   p = (b*H + y)*W + x,  k = (ci*KS + ky)*KS + kx
 *   col[k, p]       = in[b, ci, y + ky - PAD, x + kx - PAD]   (zero outside the image; never stored anywhere)
 *
 * GEMM view: M = output channels, N = batch * H * W pixels, K = Cin * KS * KS.
 *   A = weights, re-laid out once at load ("transposed, padded, column blocks"):  wt[k * Mpad + m],
 *       Kpad = K rounded up to TK, Mpad = M rounded up to TM, padding filled with zeros, so A loads need no checks.
 *   B = the implicit im2col matrix, gathered straight from the NCHW input `in` with bounds checks.
 *   C = NCHW output `out[(b * M + m) * H * W + y * W + x]`.
 * A fully connected layer is the same kernel with KS = 1, PAD = 0, H = W = 1 (a 1x1 convolution on a 1x1 image):
 *   out[b * M + m] = act(bias[m] + sum_k W[m, k] * in[b * K + k]).
 *
 *           N (pixels) ->   one work-group computes a TM x TN tile of C; the K loop walks TK-deep slices:
 *        +-----------+        As[buf][TK][TM]  <- wt rows k0..k0+TK, columns m0..m0+TM   (coalesced)
 *      M |   TM x TN |        Bs[buf][TK][TN]  <- col rows k0..k0+TK, columns n0..n0+TN  (gathered, checked)
 *        +-----------+      double buffered: slice t+1 is fetched into registers while slice t is multiplied.
 * Work-item (tx, ty) of the (TN/WN) x (TM/WM) work-group holds a WM x WN register block of C:
 *   rows m0 + ty + i * (TM/WM), columns n0 + tx + j * (TN/WN)   (strided, so local reads are conflict-free).
 * The host launches whole work-groups only (global size rounded up to the tile); every tail is handled by the
 * bounds checks on B and on the store, so there are no partial work-groups.
 *
 * Storage (storage.clh): in, wt and out are each FP32 or FP16 (IN_HALF, W_HALF, OUT_HALF); math and local tiles
 * are FP32. Split-K partial sums are always FP32.
 *
 * Split K (SPLITK = 1; used for fully connected layers, whose few M x N tiles cannot fill a large GPU): work-group
 * z = get_group_id(2) sums only k in [z * kchunk, min(K, (z + 1) * kchunk)), kchunk a multiple of TK, and stores
 * its raw sum to part[(z * N + p) * Mpad + m] (`out` is then the partial-sum buffer); fc_gemv.cl's fc_reduce adds
 * the partial sums, the bias and the activation.
 */

#ifndef TM
#define TM 64   /* tile size in M (output channels) per work-group, e.g. 32, 64, 128 */
#endif
#ifndef TN
#define TN 64   /* tile size in N (pixels) per work-group, e.g. 32, 64, 128 */
#endif
#ifndef TK
#define TK 16   /* depth of one K slice held in local memory, e.g. 8, 16, 32 */
#endif
#ifndef WM
#define WM 4    /* outputs per work-item in M (register blocking), e.g. 2, 4, 8 */
#endif
#ifndef WN
#define WN 4    /* outputs per work-item in N (register blocking), e.g. 2, 4, 8 */
#endif
#ifndef LPAD
#define LPAD 1  /* extra floats per local-memory row, against bank conflicts (0 or 1) */
#endif
#ifndef KS
#define KS 3    /* kernel size (3 for VGG's convolutions, 1 for fully connected layers) */
#endif
#ifndef PAD
#define PAD 1   /* zero padding on each side (1 for 3x3 "same" convolutions, 0 for fully connected) */
#endif
#ifndef RELU
#define RELU 1  /* fuse max(0, .) into the store */
#endif
#ifndef SPLITK
#define SPLITK 0  /* 1: K split over get_group_id(2), raw partial sums stored (see above) */
#endif

#include "gemm_loop.clh"  /* LM, LN, NT, A_LOADS, B_LOADS; the tile, K loop and A loads both GEMMs share */
#include "storage.clh"    /* in_t, w_t, out_t: FP32 or FP16 storage (IN_HALF, W_HALF, OUT_HALF) */

#if NT >= TN
#define BCOLS 1                 /* B columns gathered by one work-item */
#define BSPAN TN
#else
#define BCOLS (TN / NT)
#define BSPAN NT
#endif
#define BSTEP (NT / BSPAN)      /* row stride between one work-item's B rows */
#define BROWS (TK / BSTEP)      /* rows per column per work-item; BCOLS * BROWS == B_LOADS */
#define KK (KS * KS)

__kernel __attribute__((reqd_work_group_size(LN, LM, 1)))
void conv_gemm(__global const in_t *restrict in,     /* NCHW input, B x C x H x W */
               __global const w_t *restrict wt,      /* Kpad x Mpad re-laid weights */
               __global const float *restrict bias,  /* M */
#if SPLITK
               __global float *restrict out,         /* partial sums (see above) */
#else
               __global out_t *restrict out,         /* NCHW output, B x M x H x W */
#endif
               const int C, const int H, const int W, const int M, const int Mpad, const int N
#if SPLITK
               , const int kchunk  /* K per split, a multiple of TK */
#endif
               )
{
    const int K = C * KK;
#if SPLITK
    const int kbeg = get_group_id(2) * kchunk;
    const int kend = min(K, kbeg + kchunk);
#else
    const int kbeg = 0, kend = K;
#endif
    const int HW = H * W;
    GEMM_TILE()

    /* B tile gathering: work-item tid owns BCOLS columns (tid % BSPAN + c * NT) and, in each, the rows
     * tid / TN + r * BSTEP. Its pixels never change along K, so they are decomposed once here. */
    size_t pb[BCOLS];
    int py[BCOLS], px[BCOLS], pok[BCOLS];
    for (int c = 0; c < BCOLS; ++c) {
        const int p = n0 + tid % BSPAN + c * NT;
        pok[c] = p < N;
        const int b = pok[c] ? p / HW : 0;
        const int yx = pok[c] ? p - b * HW : 0;
        pb[c] = (size_t)b * C * HW;
        py[c] = yx / W;
        px[c] = yx - (yx / W) * W;
    }
    const int brow0 = tid / BSPAN;

    GEMM_REGS()

    const int ntiles = (kend - kbeg + TK - 1) / TK;

#define W_AT(i) LD_W(wt, i)
#define FETCH(k0)                                                                        \
    GEMM_FETCH_A(W_AT, k0)                                                               \
    for (int c = 0; c < BCOLS; ++c)                                                      \
        for (int r = 0; r < BROWS; ++r) {                                                \
            const int k = (k0) + brow0 + r * BSTEP;                                      \
            float v = 0.0f;                                                              \
            if (pok[c] && k < K) {                                                       \
                const int ci = k / KK, q = k - (k / KK) * KK;                            \
                const int iy = py[c] + q / KS - PAD, ix = px[c] + q % KS - PAD;          \
                if (iy >= 0 && iy < H && ix >= 0 && ix < W)                              \
                    v = LD_IN(in, pb[c] + (size_t)ci * HW + iy * W + ix);       \
            }                                                                            \
            rb[c * BROWS + r] = v;                                                       \
        }

#define STASH(buf)                                                                       \
    GEMM_STASH_A(buf)                                                                    \
    for (int c = 0; c < BCOLS; ++c)                                                      \
        for (int r = 0; r < BROWS; ++r) Bs[buf][brow0 + r * BSTEP][tid % BSPAN + c * NT] = rb[c * BROWS + r];

    GEMM_K_LOOP(FETCH, STASH, kbeg)

#if SPLITK
    __global float *part = out + (size_t)get_group_id(2) * N * Mpad;
#define PART_AT(m, q) part[(size_t)(q) * Mpad + (m)]
    GEMM_STORE_RAW(N, PART_AT)
    return;
#endif
    for (int j = 0; j < WN; ++j) {
        const int q = n0 + tx + j * LN;
        if (q >= N) continue;
        const int qb = q / HW, qyx = q - (q / HW) * HW;
        __global out_t *o = out + (size_t)qb * M * HW + qyx;
        for (int i = 0; i < WM; ++i) {
            const int m = m0 + ty + i * LM;
            if (m < M) {
                float v = acc[i][j] + bias[m];
#if RELU
                v = fmax(v, 0.0f);
#endif
                ST_OUT(o, (size_t)m * HW, v);
            }
        }
    }
}
