/* conv_tc_halo.cl -- 3x3 convolution on NVIDIA tensor cores from halo tiles: each input patch is fetched once per
 * channel chunk and serves all nine taps.
 *
 *   out[b, y, x, n] = act( bias[n] + sum_{ky, kx, ci} in[b, y + ky - 1, x + kx - 1, ci] * Wt[n, (ky*3 + kx)*CpadK + ci] )
 *
 * Layouts, storage and epilogue as conv_tc.cl (NHWC activations, FP16, TF32, FP8 or INT8 with its scales cs and
 * out_scale_inv; mma.clh, tc_epilogue.clh), except the weights' k index: taps of CpadK channels each, CpadK = Cpad
 * rounded up to a chunk (CK = 64 bytes of channels: 32 FP16, 16 TF32, 64 FP8 or INT8), zero-padded.
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
 *
 * WGMMA = 1 (Hopper, sm_90a; wgmma.clh): each warpgroup of 4 warps multiplies its 64 block rows by the whole BN-wide
 * weight stage with wgmma.mma_async, A in registers and B from local memory: A's rows of tap (ky, kx) start at patch
 * rows that are not multiples of 8, which no matrix descriptor can address, so each warp still takes its 16 rows from
 * the patch by ldmatrix.x4 (the mma.sync A fragment is wgmma's register fragment of A for that warp); the weight
 * stage is laid out as wgmma's core matrices (conv_tc.cl's WGMMA layout, 64-byte rows: SBO 512 bytes) instead of the
 * XOR swizzle, and read through a descriptor. Shape: WARPS_N = 1, one m16 tile per warp (WARPS_M = TH * TW / 16, a
 * multiple of 4: BM = 64 per warpgroup), BN = 64, 128, 192 or 256; the accumulators are laid out as above, so the
 * epilogue and the fused pooling (TW = 8 only: a window's rows must lie in one warp's 16) are unchanged. Order of a
 * step: its copies landed (WG_CP_WAIT, proxy fence), the warpgroup's wgmma of step s - 1 - WG_INFLIGHT done (WG_WAIT:
 * every wgmma still running reads other A registers, and after the barrier no warpgroup reads the stage about to be
 * refilled), barrier, ldmatrix, wgmma (asynchronous), then the copies of step s + LEAD (LEAD = STAGES - 1 -
 * WG_INFLIGHT) are issued while the tensor cores run. WG_INFLIGHT = 1 leaves a step's wgmma running across the next
 * step's barrier and ldmatrix: the A fragments alternate between two register sets (af0 for even steps, af1 for odd
 * ones: the loop is unrolled by two), and copies run one step less ahead. The program is built from the driver's PTX
 * with the placeholders replaced (vggserve/runtime/ptx.py); emulated like the rest (wgmma.clh's model).
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
#ifndef INT8
#define INT8 0      /* 1: u8 activations x s8 weights, int32 sums, scaled by cs[n] (conv_tc.cl) */
#endif
#ifndef OUT_INT8
#define OUT_INT8 0  /* 1: out is u8 codes of out * out_scale_inv */
#endif
#ifndef MMA_EMULATE
#define MMA_EMULATE 0
#endif
#ifndef POOL
#define POOL 0      /* 1: a 2x2/2 max-pool fused into the store (TH even; TW 8, or a multiple of 16 with WTM of 2*TW) */
#endif
#ifndef WGMMA
#define WGMMA 0     /* 1: Hopper's wgmma (sm_90a, through the driver's patched PTX), A in registers */
#endif
#ifndef WG_INFLIGHT
#define WG_INFLIGHT 0   /* WGMMA: wgmma groups left running across the next step's barrier (0 or 1; 1: 3+ stages) */
#endif

#include "mma.clh"          /* storage types, TF32 rounding, cp.async / ldmatrix / mma.sync (or their model) */
#include "tc_halo.clh"      /* TH (default 8), the block, its input patch and their maps */
#include "tc_epilogue.clh"  /* RELU (default 1): bias, ReLU, the store, the fused pooling */

#define KB 64                      /* bytes of a chunk of channels (a local row) */
#define CHUNKS 4                   /* 16-byte pieces per row */
#define CK (KB / ELEM)             /* channels per chunk: 32 FP16, 16 TF32 or 64 FP8 / INT8 */
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

#if WGMMA && EIGHT_BIT
#error "WGMMA: FP16 or TF32 (FP8 and INT8 run on mma.sync)"
#endif
#if WGMMA                     /* the weight stage as wgmma's core matrices (wgmma.clh) */
#if WARPS_N != 1 || WTM != 16 || WARPS_M % 4 || BN % 64 || BN > 256 || STAGES < 2 + WG_INFLIGHT || WG_INFLIGHT > 1
#error "WGMMA: WARPS_N = 1, WARPS_M = TH*TW/16 (4 a warpgroup), BN 64 to 256 by 64, STAGES >= 2 + WG_INFLIGHT (0, 1)"
#endif
#define BK CK
#include "wgmma.clh"
#endif

__kernel __attribute__((reqd_work_group_size(THREADS, 1, 1)))
void conv_tc_halo(__global const elem_t *restrict in,   /* NHWC, Cpad channels */
                  __global const elem_t *restrict wt,   /* Npad x 9*CpadK */
                  __global const float *restrict bias,  /* Npad */
#if EIGHT_BIT
                  __global const float *restrict cs,    /* Npad: s_in * s_w[n] */
#endif
#if OUT_EIGHT_BIT
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

#if WGMMA
    /* weights: this work-item's rows (tid % 8) + 8 (tid / 32) + i * (THREADS / CHUNKS), piece c = (tid / 8) % 4: a warp
     * copies 8 rows of 4 pieces, the same bytes as below, and local chunk WG_CORE(row, c) is then simply tid (8 lanes
     * write 128 consecutive bytes: one core matrix) */
    const int c = (tid >> 3) & 3;
    const int brow = (tid & 7) + 8 * (tid >> 5);
    __global const uchar *wrow = (__global const uchar *)(wt + (size_t)(n0 + brow) * Kw + c * VEC);
    const size_t wstep = (size_t)(THREADS / CHUNKS) * Kw * ELEM;
    const uint bs_row0 = tid;
#else
    /* weights: this work-item's rows tid / CHUNKS + i * (THREADS / CHUNKS), piece c = tid % CHUNKS */
    const int c = tid % CHUNKS;
    __global const uchar *wrow = (__global const uchar *)(wt + (size_t)(n0 + tid / CHUNKS) * Kw + c * VEC);
    const size_t wstep = (size_t)(THREADS / CHUNKS) * Kw * ELEM;
    const uint bs_row0 = SWZ4(tid / CHUNKS, c);
#endif

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

#if WGMMA
#define LEAD (STAGES - 1 - WG_INFLIGHT)  /* steps whose copies are issued ahead */
    /* step s_ with its A fragments in AF_, registers that no wgmma still running reads. After WG_WAIT and the
     * barrier, every warpgroup's wgmma up to step s_ - 1 - WG_INFLIGHT are done: their stage, (s_ + LEAD) % STAGES, is
     * refilled, and at a new chunk the patch buffer chunk - 2 used (read by ldmatrix only, before the barrier) */
#define WG_HALO_STEP(s_, AF_)                                                                             \
    {                                                                                                     \
        WG_CP_WAIT(LEAD - 1);  /* step s_'s copies have landed */                                         \
        WG_PROXY();                                                                                       \
        WG_WAIT(acc, WG_INFLIGHT);                                                                        \
        barrier(CLK_LOCAL_MEM_FENCE);                                                                     \
        HALO_STEP(s_)                                                                                     \
        MMA_UNROLL for (int ks = 0; ks < KSTEPS; ++ks) LDSM_X4(AF_[ks], A_ADDR);                          \
        WG_STAGE_RA(acc, AF_, bs + ((s_) % STAGES) * BN * CHUNKS);                                        \
        if (WG_COPIES && (s_) + LEAD < nsteps) LOAD_STEP((s_) + LEAD)                                     \
        CP_COMMIT();                                                                                      \
    }
    for (int s = 0; s < LEAD; ++s) {
        if (s < nsteps) LOAD_STEP(s)
        CP_COMMIT();
    }
    const int mrow0 = warp * 16;  /* this warp's 16 block rows (wm = warp: WARPS_N = 1) */
    uint af0[KSTEPS][4];
#if WG_INFLIGHT
    uint af1[KSTEPS][4];
    int s = 0;
    for (; s + 1 < nsteps; s += 2) {
        WG_HALO_STEP(s, af0)
        WG_HALO_STEP(s + 1, af1)
    }
    if (s < nsteps) WG_HALO_STEP(s, af0)  /* an odd number of chunks: 9 per chunk */
#else
    for (int s = 0; s < nsteps; ++s) WG_HALO_STEP(s, af0)
#endif
    WG_WAIT(acc, 0);
#else
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
#endif

    const int g = lane >> 2, t4 = lane & 3;
#if POOL
    TC_STORE_POOLED_PIXEL_ROWS(MI, NJ, wm * WTM, n0 + wn * WTN, HALO_POOLED)
#else
    TC_STORE_PIXEL_ROWS(MI, NJ, wm * WTM, n0 + wn * WTN, HALO_PIXEL, TC_STORE_ACT2)
#endif
}
