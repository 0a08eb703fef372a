/* conv_tc_sparse.cl -- 3x3 convolution (padding 1) with 2:4-sparse weights on NVIDIA sparse tensor cores (mma.sp).
 *
 *   out[p, n] = act( bias[n] + sum_k  Wt[n, k] * X[k, p] )        n = output channel, p = pixel (b*H + y)*W + x
 *   X[k, p]   = in[b, y + ky - 1, x + kx - 1, ci]   (NHWC, zero outside the image; never stored anywhere)
 *   k         = (ky*3 + kx)*Cpad + ci               (conv_tc.cl's K order: ci fastest, 8 channels per 16 bytes)
 *
 * mma.sp lets only its A operand be sparse, so here A = the weights (rows = output channels) and B = the
 * activations (columns = pixels): the transpose of conv_tc.cl, where A holds pixels. Every chunk of 4 consecutive
 * k of a weight row holds at most 2 non-zeros (weights prune --pattern 2:4 groups input channels of one tap, which
 * is this order); the host compresses them at load (ops/sparse24.py):
 *   wv:   Npad x Kpad/2 FP16, the two kept values of every chunk                     wv[n * Kpad/2 + k/2]
 *   meta: (Npad/16) x (Kpad/32) x 16 uints, word 2g + h = the metadata register of thread h of quad g for one
 *         m16n8k32 step (mma.clh's banner)                     meta[((n / 16) * Kpad/32 + k / 32) * 16 + 2g + h]
 *   in:   NHWC, Cpad channels per pixel (Cpad a multiple of 8, pad channels zero)    in[p * Cpad + ci]
 *   bias: Npad floats (zero past the layer's channels); out: NHWC FP16, Cstore channels   out[p * Cstore + n]
 * so the weights move half the bytes of dense (plus 1/16 for the metadata), all by 16-byte cp.async.
 *
 *      pixels (BN) ->       work-group (gm, gn) computes BM channels x BN pixels; its K loop walks KB-byte k-tiles
 *    +-----------+          (BK = KB/2 k), STAGES of them in flight (cp.async), each stage holding
 *  BM|  BM x BN  |            Xs[BN pixel rows][KB bytes]     <- gathered activations (zero fill), as conv_tc.cl
 * (ch)+-----------+           Ws[BM rows][KB/2 bytes]         <- compressed weight rows
 *                             Ms[BM/16][KB/64 steps][16 words] <- metadata, one run of words per 16 rows
 * Rows are XOR-swizzled in 16-byte units (conv_tc.cl's SWZ) so that one ldmatrix phase hits 8 bank groups.
 * Warps: WARPS_M x WARPS_N, each a WTM x WTN block = MI x NJ tiles of 16 channels x 8 pixels; per 32 k (one
 * mma.sp): A by ldmatrix.x4 over 16 compressed rows x 32 bytes (the dense m16n8k16 A layout of the compressed
 * matrix), B by ldmatrix.x4 over 8 pixel rows x 64 bytes (b_i = k 8i .. 8i + 7), the metadata word by one
 * local load; MI x NJ mma.sp m16n8k32, each doing the work of two dense m16n8k16.
 * Epilogue: bias + ReLU fused; lane (g, t) holds channels g, g + 8 of pixels 2t, 2t + 1 of each tile, stored as
 * FP16 one by one (adjacent channels of a pixel sit in different lanes).
 * MMA_EMULATE = 1 runs the same on any OpenCL device through mma.clh's software model of mma.sp (PoCL in CI).
 */

#ifndef BM
#define BM 128      /* output channels per work-group, a multiple of 16 * WARPS_M */
#endif
#ifndef BN
#define BN 128      /* pixels per work-group, a multiple of 8 * WARPS_N */
#endif
#ifndef WARPS_M
#define WARPS_M 2   /* warps along the channels; WTM = BM / WARPS_M, a multiple of 16 */
#endif
#ifndef WARPS_N
#define WARPS_N 4   /* warps along the pixels; WTN = BN / WARPS_N, a multiple of 8 */
#endif
#ifndef STAGES
#define STAGES 3    /* k-tiles in flight; local memory STAGES * (BN * KB + BM * KB / 2 + BM * KB / 16) <= 48 KB */
#endif
#ifndef KB
#define KB 64       /* activation bytes per pixel row per k-tile: 64 or 128 (32 or 64 k, 1 or 2 mma.sp steps) */
#endif
#ifndef MMA_EMULATE
#define MMA_EMULATE 0
#endif

#define KS 3                         /* 3x3 filters, zero padding 1 (tc_gather.clh) */
#define PAD 1
#define THREADS (32 * WARPS_M * WARPS_N)
#define BK (KB / 2)                  /* k per k-tile */
#define KSTEPS (KB / 64)             /* mma.sp steps (32 k) per k-tile */
#define XCH (KB / 16)                /* 16-byte chunks per activation row */
#define WCH (KB / 32)                /* 16-byte chunks per compressed weight row */
#define MCH (4 * KSTEPS)             /* 16-byte chunks of metadata per 16 rows */
#define WTM (BM / WARPS_M)
#define WTN (BN / WARPS_N)
#define MI (WTM / 16)
#define NJ (WTN / 8)
#define X_ITERS (BN * XCH / THREADS)
#define W_ITERS ((BM * WCH + THREADS - 1) / THREADS)   /* the last one partial */
#define M_ITERS ((BM / 16 * MCH + THREADS - 1) / THREADS)
#define META_CHUNKS (BM / 16 * MCH)
#define X_CHUNKS (BN * XCH)
#define W_CHUNKS (BM * WCH)
#define STAGE_CHUNKS (X_CHUNKS + W_CHUNKS + META_CHUNKS)

#if KB == 64                 /* mma.clh's swizzles */
#define XSWZ SWZ4
#define WSWZ SWZ2
#elif KB == 128
#define XSWZ SWZ8
#define WSWZ SWZ4
#else
#error "KB must be 64 or 128"
#endif
#if (BN * XCH) % THREADS || WTM % 16 || WTN % 8 || BM % WARPS_M || BN % WARPS_N
#error "tile shape: BN*KB/16 a multiple of the work-group size, WTM of 16, WTN of 8"
#endif

#include "tc_sparse24.clh"  /* FP16, mma.clh, the stage's weight and metadata copies, the metadata word */
#include "tc_gather.clh"    /* the activation rows gathered from NHWC (implicit GEMM), as conv_tc.cl's A */
#include "tc_epilogue.clh"  /* RELU (default 1): bias, ReLU and the store of the accumulators */

__kernel __attribute__((reqd_work_group_size(THREADS, 1, 1)))
void conv_tc_sparse(__global const ushort *restrict in,    /* NHWC, Cpad channels */
                    __global const ushort *restrict wv,    /* Npad x Kpad/2 kept values */
                    __global const uint *restrict meta,    /* Npad/16 x Kpad/32 x 16 */
                    __global const float *restrict bias,   /* Npad */
                    __global ushort *restrict out,         /* NHWC, Cstore channels */
                    const int Cpad, const int H, const int W, const int NPIX, const int Cstore, const int Kpad,
                    const int groups_m)
{
    __local uint4 smem[STAGES * STAGE_CHUNKS];
    MMA_WARPS(xch_sp, XCH_SP)
    const int gid = get_group_id(0);
    const int m0 = (gid % groups_m) * BM, p0 = (gid / groups_m) * BN;
    const int nt = Kpad / BK;
    const int HW = H * W;

    /* activations, as conv_tc.cl's A: rows tid / XCH + i * (THREADS / XCH), all at chunk c = tid % XCH, so they
     * share one k position (tap, ci); per row the pixel's offset and a bit per tap inside the image (tc_gather.clh) */
    const int c = tid % XCH;
    int aoff[X_ITERS];
    uint amask[X_ITERS];
#pragma unroll
    for (int i = 0; i < X_ITERS; ++i) TC_GATHER_ROW(i, p0, XCH)
    TC_GATHER_START(c * VEC)
    const uint sx_row0 = XSWZ(tid / XCH, c);   /* row r_i adds i * THREADS chunks: the swizzle period divides it */

    /* weights: chunks tid, tid + THREADS, ... of the BM x WCH chunks of a k-tile (rows of Kpad/2 halves) */
    __global const uchar *wtile = (__global const uchar *)(wv + (size_t)m0 * (Kpad / 2));
    /* metadata: the words of rows m0 .. m0 + BM - 1 for k-tile t, MCH chunks per 16 rows */
    __global const uint4 *mbase = (__global const uint4 *)meta + (size_t)(m0 / 16) * (Kpad / 32) * 4;

#define X_ADDR(l) (sx + XSWZ(wn * WTN + nj * 8 + ((l) & 7), ks * 4 + ((l) >> 3)))
#define W_ADDR(l) (sw + WSWZ(wm * WTM + mi * 16 + ((l) & 7) + (((l) >> 3) & 1) * 8, ks * 2 + ((l) >> 4)))

#define LOAD_STAGE(t_, stage)                                                                             \
    {                                                                                                     \
        __local uint4 *sx_ = smem + (stage) * STAGE_CHUNKS;                                               \
        __local uint4 *sw_ = sx_ + X_CHUNKS, *sm_ = sw_ + W_CHUNKS;                                       \
        TC_GATHER_COPY(sx_ + sx_row0, X_ITERS)                                                            \
        for (int i = 0; i < W_ITERS; ++i) {                                                               \
            const int e_ = tid + i * THREADS;                                                             \
            if (e_ < W_CHUNKS) SP_COPY_WEIGHTS(sw_, wtile, Kpad, e_)                                      \
        }                                                                                                 \
        for (int i = 0; i < M_ITERS; ++i) {                                                               \
            const int e_ = tid + i * THREADS;                                                             \
            if (e_ < META_CHUNKS) SP_COPY_META(sm_, mbase, Kpad / 32, (t_) * KSTEPS, e_)                  \
        }                                                                                                 \
        wtile += KB / 2;                                                                                  \
        ci += BK;                                                                                         \
        while (ci >= Cpad) {                                                                              \
            ci -= Cpad;                                                                                   \
            ++tap;                                                                                        \
        }                                                                                                 \
        delta = TC_TAP_DELTA(tap, ci);                                                                    \
    }

    MMA_ACC(acc, MI, NJ)

    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < nt) LOAD_STAGE(s, s)
        CP_COMMIT();
    }
    const int g = lane >> 2, t4 = lane & 3;
    for (int t = 0; t < nt; ++t) {
        CP_WAIT();
        barrier(CLK_LOCAL_MEM_FENCE);
        __local uint4 *sx = smem + (t % STAGES) * STAGE_CHUNKS;
        __local uint4 *sw = sx + X_CHUNKS;
        __local const uint *sm = (__local const uint *)(sw + W_CHUNKS);
        MMA_UNROLL
        for (int ks = 0; ks < KSTEPS; ++ks) {
            uint af[MI][4], bf[NJ][4], ef[MI];
            MMA_UNROLL
            for (int mi = 0; mi < MI; ++mi) {
                LDSM_X4(af[mi], W_ADDR);
                ef[mi] = SP_META_WORD(sm, (wm * MI + mi) * KSTEPS + ks);
            }
            MMA_UNROLL
            for (int nj = 0; nj < NJ; ++nj) LDSM_X4(bf[nj], X_ADDR);
            MMA_UNROLL
            for (int mi = 0; mi < MI; ++mi)
                MMA_UNROLL
                for (int nj = 0; nj < NJ; ++nj) MMA_SP(acc[mi][nj], af[mi], bf[nj], ef[mi]);
        }
        /* the stage refilled now was last read in iteration t - 1, which every warp has left (barrier above) */
        if (t + STAGES - 1 < nt) LOAD_STAGE(t + STAGES - 1, (t + STAGES - 1) % STAGES)
        CP_COMMIT();
    }

    /* epilogue: acc[mi][nj][q] is channel .. + g + 8 (q / 2), pixel .. + 2 t4 + q % 2 (tc_epilogue.clh) */
#define PIXEL(r)                                                                                          \
    const int p = p0 + (r);                                                                               \
    if (p >= NPIX) continue;
    TC_STORE_CHANNEL_ROWS(MI, NJ, m0 + wm * WTM, wn * WTN, PIXEL)
}
