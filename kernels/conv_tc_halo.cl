/* conv_tc_halo.cl -- 3x3 convolution on NVIDIA tensor cores from halo tiles: each input patch is fetched once per
 * channel chunk and serves all nine taps.
 *
 *   out[b, y, x, n] = act( bias[n] + sum_{ky, kx, ci} in[b, y + ky - 1, x + kx - 1, ci] * Wt[n, (ky*3 + kx)*CpadK + ci] )
 *
 * Layouts, storage and epilogue as conv_tc.cl (NHWC activations, FP16, TF32 or FP8 with its scales cs and
 * out_scale_inv; mma.clh, tc_epilogue.clh), except the weights' k index: taps of CpadK channels each, CpadK = Cpad
 * rounded up to a chunk (CK = 64 bytes of channels: 32 FP16, 16 TF32, 64 FP8), zero-padded.
 *   in:   NHWC, Cpad channels per pixel                                 in[p * Cpad + ci]
 *   wt:   Npad x (9 * CpadK)                                            wt[n * 9 * CpadK + tap * CpadK + ci]
 *   out:  NHWC, Cstore channels per pixel                               out[p * Cstore + n]
 *         (POOL = 1: of the pooled image, (H/2) x (W/2) pixels per image)
 *
 * A work-group computes a TH x TW block of one image's output pixels (BM = TH * TW rows of the GEMM) for BN output
 * channels. Its K loop walks steps (chunk, tap): for each chunk of CK channels it fetches the (TH + 2) x (TW + 2)
 * input patch around its block once (zeros outside the image), then runs the nine taps on it, reading the A rows of
 * tap (ky, kx) straight from the patch: ldmatrix takes one row address per lane, and output pixel (r / TW, r % TW)
 * of tap (ky, kx) is patch pixel (r / TW + ky, r % TW + kx). conv_tc.cl fetches those rows nine times, once per
 * tap, so this moves about 9x fewer activation bytes from L2 (weights: the same).
 *
 *   patch[2][(TH+2)*(TW+2)][64 bytes]   two chunks' patches: chunk j + 1's is fetched while chunk j's taps run
 *   Bs[STAGES][BN][64 bytes]            weight rows of STAGES steps in flight
 * Rows of 64 bytes, XOR-swizzled in 16-byte units (conv_tc.cl's SWZ), so ldmatrix's 8 rows hit 8 bank groups.
 * The patch of chunk j is copied with step (j, 0)'s weights, in one cp.async group, into patch[j % 2]; it is
 * issued STAGES - 1 steps ahead (STAGES - 1 < 9), while chunk j - 1 runs on the other buffer.
 * Warps, fragments, epilogue (bias, ReLU, two channels per store) as conv_tc.cl; rows past the image are not
 * stored. MMA_EMULATE = 1 runs the same on any OpenCL device (mma.clh).
 *
 * POOL = 1 fuses the 2x2, stride-2 max-pool that follows the layer into the store: out becomes NHWC of
 * (H/2) x (W/2) pixels (floor: a trailing odd row or column is dropped, as torch's MaxPool2d(2, 2)). A block starts
 * at an even pixel (TH even, TW a multiple of 8), so each 2x2 window lies within one block, and within one warp when
 * TW = 8 (a fragment's rows g and g + 8 are two image rows) or TW is a multiple of 16 and the warp's rows WTM are a
 * multiple of 2 * TW (the row below is fragment mi + TW/16 of the same warp); tc_epilogue.clh pools them (one
 * shfl.sync.bfly per value for the pixel beside) before the bias and the ReLU, which equals pooling the stored
 * outputs bit for bit, and even-g lanes store one pixel of the pooled output.
 * Shared with conv_tc_halo_sparse.cl: the block, patch and its load (tc_halo.clh) and the store (tc_epilogue.clh).
 */

#ifndef TW
#define TW 16       /* output block width (pixels), any width: a multiple of 8 keeps an ldmatrix phase's 8 rows in one
                     * patch row (bank-conflict free); 14 or 28 fit 14/28/56-pixel images without a ragged block */
#endif
#ifndef BN
#define BN 128      /* output channels per work-group */
#endif
#ifndef WARPS_M
#define WARPS_M 2
#endif
#ifndef WARPS_N
#define WARPS_N 2
#endif
#ifndef STAGES
#define STAGES 3    /* steps in flight; local memory: 2 * (TH+2)(TW+2) * 64 + STAGES * BN * 64 bytes <= 48 KB */
#endif
#ifndef TF32
#define TF32 0
#endif
#ifndef OUT_F32
#define OUT_F32 0
#endif
#ifndef FP8
#define FP8 0       /* 1: e4m3 storage and mma, scaled by cs[n] (conv_tc.cl) */
#endif
#ifndef OUT_FP8
#define OUT_FP8 0   /* 1: out is e4m3 codes of out * out_scale_inv */
#endif
#ifndef MMA_EMULATE
#define MMA_EMULATE 0
#endif
#ifndef POOL
#define POOL 0      /* 1: a 2x2/2 max-pool fused into the store (TH even; TW 8, or a multiple of 16 with WTM of 2*TW) */
#endif

#include "mma.clh"          /* storage types, TF32 rounding, cp.async / ldmatrix / mma.sync (or their model) */
#include "tc_halo.clh"      /* TH (default 8), the block, its input patch and their maps */
#include "tc_epilogue.clh"  /* RELU (default 1): bias, ReLU, the store, the fused pooling */

#define KB 64                      /* bytes of a chunk of channels (a local row) */
#define CHUNKS 4                   /* 16-byte pieces per row */
#define CK (KB / ELEM)             /* channels per chunk: 32 FP16, 16 TF32 or 64 FP8 */
#define KSTEPS 2                   /* mma k-steps per row (32 bytes each) */
#define BM (TH * TW)
#define THREADS (32 * WARPS_M * WARPS_N)
#define WTM (BM / WARPS_M)
#define WTN (BN / WARPS_N)
#define MI (WTM / 16)
#define NJ (WTN / 8)
#define B_ITERS (BN * CHUNKS / THREADS)
#if WTM % 16 || WTN % 16 || (BN * CHUNKS) % THREADS
#error "tile shape: WTM and WTN multiples of 16, BN*4 a multiple of the work-group size"
#endif
#if POOL && (TH % 2 || !(TW == 8 || (TW % 16 == 0 && WTM % (2 * TW) == 0)))
#error "POOL: TH even, and TW 8 or a multiple of 16 with WTM a multiple of 2*TW"
#endif

__kernel __attribute__((reqd_work_group_size(THREADS, 1, 1)))
void conv_tc_halo(__global const elem_t *restrict in,   /* NHWC, Cpad channels */
                  __global const elem_t *restrict wt,   /* Npad x 9*CpadK */
                  __global const float *restrict bias,  /* Npad */
#if FP8
                  __global const float *restrict cs,    /* Npad: s_in * s_w[n] */
#endif
#if OUT_FP8
                  const float out_scale_inv,            /* 1 / s_out */
#endif
                  __global out_t *restrict out,         /* NHWC, Cstore channels */
                  const int Cpad, const int CpadK, const int H, const int W, const int Cstore,
                  const int groups_n, const int tiles_x, const int tiles_per_image)
{
    __local uint4 patch[2 * PATCH_CHUNKS];
    __local uint4 bs[STAGES * BN * CHUNKS];
    MMA_WARPS(xch, 6)
    const int gid = get_group_id(0);
    HALO_BLOCK()
    const size_t Kw = (size_t)9 * CpadK;

    /* weights: this work-item's rows tid / CHUNKS + i * (THREADS / CHUNKS), piece c = tid % CHUNKS */
    const int c = tid % CHUNKS;
    __global const uchar *wrow = (__global const uchar *)(wt + (size_t)(n0 + tid / CHUNKS) * Kw + c * VEC);
    const size_t wstep = (size_t)(THREADS / CHUNKS) * Kw * ELEM;
    const uint bs_row0 = SWZ4(tid / CHUNKS, c);

    /* step s = (chunk s / 9, tap s % 9): its weights (and, at tap 0, its chunk's patch) into stage s % STAGES */
#define LOAD_STEP(s)                                                                                      \
    {                                                                                                     \
        const int chunk_ = (s) / 9, tap_ = (s) - chunk_ * 9;                                              \
        __local uint4 *b_ = bs + ((s) % STAGES) * BN * CHUNKS + bs_row0;                                  \
        __global const uchar *w_ = wrow + ((size_t)tap_ * CpadK + (size_t)chunk_ * CK) * ELEM;            \
        for (int i = 0; i < B_ITERS; ++i) CP_ASYNC16(b_ + i * THREADS, w_ + i * wstep, 1);                \
        if (tap_ == 0) HALO_LOAD_PATCH(chunk_)                                                            \
    }

    /* ldmatrix row addresses: A from the patch (pixel of output row r shifted by the tap), B from the stage */
#define A_ADDR(l) (pa + SWZ4(HALO_ROW(mrow0 + ((l) & 7) + (((l) >> 3) & 1) * 8), ks * 2 + ((l) >> 4)))
#define B_ADDR(l) (sb + SWZ4(wn * WTN + nj2 * 16 + ((l) & 7) + ((l) >> 4) * 8, ks * 2 + (((l) >> 3) & 1)))

    MMA_ACC(acc, MI, NJ)

    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < nsteps) LOAD_STEP(s)
        CP_COMMIT();
    }
    for (int s = 0; s < nsteps; ++s) {
        CP_WAIT();
        barrier(CLK_LOCAL_MEM_FENCE);
        HALO_STEP(s)
        __local uint4 *sb = bs + (s % STAGES) * BN * CHUNKS;
        MMA_DENSE_STAGE(acc, MI, NJ, KSTEPS)
        /* refills the stage read in step s - 1 (every warp is past the barrier above), and at a new chunk the patch
         * buffer its chunk - 2 used */
        if (s + STAGES - 1 < nsteps) LOAD_STEP(s + STAGES - 1)
        CP_COMMIT();
    }

    const int g = lane >> 2, t4 = lane & 3;
#if POOL
    TC_STORE_POOLED_PIXEL_ROWS(MI, NJ, wm * WTM, n0 + wn * WTN, HALO_POOLED)
#else
    TC_STORE_PIXEL_ROWS(MI, NJ, wm * WTM, n0 + wn * WTN, HALO_PIXEL, TC_STORE_ACT2)
#endif
}
