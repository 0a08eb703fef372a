/* conv_tc_halo_sparse.cl -- 3x3 convolution with 2:4-sparse weights on NVIDIA sparse tensor cores (mma.sp m16n8k32)
 * from halo tiles: conv_tc_halo.cl's input reuse (each input patch fetched once per channel chunk, for all nine
 * taps) with conv_tc_sparse.cl's compressed weights.
 *
 *   out[b, y, x, n] = act( bias[n] + sum_{ky,kx,ci} Wt[n, (ky*3 + kx)*CpadK + ci] * in[b, y + ky - 1, x + kx - 1, ci] )
 *
 * K order as conv_tc_halo.cl: taps of CpadK channels (Cpad rounded up to a chunk of CK = 32 FP16 channels, zeros
 * past Cpad). A 2:4 group is 4 consecutive input channels of one tap (weights prune --pattern 2:4), so every group
 * stays inside one (tap, chunk) step. The host compresses Wt (ops/sparse24.py):
 *   wv:   Npad x 9*CpadK/2 FP16, the two kept values of every 4 k                     wv[n * 9*CpadK/2 + k/2]
 *   meta: (Npad/16) x (9*CpadK/32) x 16 uints, mma.sp metadata words (mma.clh's banner)
 *                                                                 meta[((n / 16) * 9*CpadK/32 + k / 32) * 16 + w]
 *   in:   NHWC, Cpad channels per pixel (a multiple of 8, pad channels zero)           in[p * Cpad + ci]
 *   out:  NHWC FP16, Cstore channels per pixel                                         out[p * Cstore + n]
 * so the weights move half of conv_tc_halo.cl's bytes (plus 1/16 for the metadata) and it issues half the mma.
 *
 * mma.sp lets only A be sparse, so A = the weights (16 output channels) and B = the activations (8 pixels): the
 * transpose of conv_tc_halo.cl. The tunables keep conv_tc_halo.cl's meaning, so its tiles carry over: a work-group
 * computes a TH x TW block of one image's pixels (BP = TH * TW) for BN output channels; WARPS_M warps split the
 * pixels (WTM = BP / WARPS_M each, a multiple of 8), WARPS_N the channels (WTN = BN / WARPS_N, a multiple of 16).
 * Its K loop walks steps (chunk, tap), one mma.sp k-step (32 k) each:
 *   patch[2][(TH+2)*(TW+2)][64 bytes]    two chunks' input patches (as conv_tc_halo.cl, XOR-swizzled SWZ4)
 *   stage[STAGES]: Ws[BN][32 bytes]      compressed weight rows of one step (SWZ2)
 *                  Ms[BN/16][16 words]   their metadata, one run of words per 16 rows
 * The patch of chunk j is copied with step (j, 0)'s weights in one cp.async group into patch[j % 2], STAGES - 1
 * steps ahead (STAGES - 1 < 9). Per step a warp loads its A fragments (ldmatrix.x4 over 16 compressed rows x 32
 * bytes) and metadata words once, then for each 8-pixel tile one ldmatrix.x4 of B straight from the patch (lane l
 * points at patch pixel (r / TW + ky, r % TW + kx) of output pixel r = .. + l % 8, 16-byte piece l / 8) and WTN / 16
 * mma.sp. Epilogue: bias + ReLU; lane (g, t) holds channels g, g + 8 of pixels 2t, 2t + 1 of each tile, stored as
 * FP16 one by one; pixels past the image are not stored. MMA_EMULATE = 1 runs it on any OpenCL device (mma.clh).
 *
 * POOL = 1 fuses the 2x2, stride-2 max-pool that follows the layer into the store, as conv_tc_halo.cl does: out
 * becomes NHWC of (H/2) x (W/2) pixels (floor). A block starts at an even pixel (TH even, TW even), and a window's
 * four pixels lie in one lane: its left and right are columns 2t, 2t + 1 of an 8-pixel tile (TW a multiple of 8, so a
 * tile never straddles two image rows), the row below is tile pi + TW/8 of the same warp (WTM a multiple of 2 * TW),
 * so the pooling needs no exchange between lanes (tc_epilogue.clh's channel-row form).
 * Shared with conv_tc_halo.cl: the block, patch and its load (tc_halo.clh) and the store (tc_epilogue.clh); with
 * conv_tc_sparse.cl: the stage's weight and metadata copies (tc_sparse24.clh).
 */

#ifndef BN
#define BN 128      /* output channels per work-group */
#endif
#ifndef WARPS_M
#define WARPS_M 2   /* warps along the pixels */
#endif
#ifndef WARPS_N
#define WARPS_N 2   /* warps along the channels */
#endif
#ifndef STAGES
#define STAGES 3    /* steps in flight; local memory 2 * (TH+2)(TW+2) * 64 + STAGES * BN * 36 bytes <= 48 KB */
#endif
#ifndef MMA_EMULATE
#define MMA_EMULATE 0
#endif
#ifndef POOL
#define POOL 0      /* 1: a 2x2/2 max-pool fused into the store (TH even, TW a multiple of 8, WTM of 2*TW) */
#endif

#include "tc_sparse24.clh"  /* FP16, mma.clh, the stage's weight and metadata copies, the metadata word */
#include "tc_halo.clh"      /* TH, TW (defaults 8 x 16), the block, its input patch and their maps */
#include "tc_epilogue.clh"  /* RELU (default 1): bias, ReLU, the store, the fused pooling */

#define CK 32                      /* channels per chunk: one 64-byte patch row, one mma.sp k-step */
#define WCH 2                      /* 16-byte pieces per compressed weight row of one step */
#define WSWZ SWZ2
#define MCH 4                      /* 16-byte pieces of metadata per 16 rows and step */
#define BP (TH * TW)
#define THREADS (32 * WARPS_M * WARPS_N)
#define WTM (BP / WARPS_M)
#define WTN (BN / WARPS_N)
#define PI (WTM / 8)               /* 8-pixel tiles per warp */
#define CJ (WTN / 16)              /* 16-channel tiles per warp */
#define W_CHUNKS (BN * WCH)
#define META_CHUNKS (BN / 16 * MCH)
#define STAGE_CHUNKS (W_CHUNKS + META_CHUNKS)
#if BP % WARPS_M || BN % WARPS_N || WTM % 8 || WTN % 16
#error "tile shape: TH*TW / WARPS_M a multiple of 8, BN / WARPS_N of 16"
#endif
#if POOL && (TH % 2 || TW % 8 || WTM % (2 * TW))
#error "POOL: TH even, TW a multiple of 8, WTM a multiple of 2*TW"
#endif

__kernel __attribute__((reqd_work_group_size(THREADS, 1, 1)))
void conv_tc_halo_sparse(__global const ushort *restrict in,   /* NHWC, Cpad channels */
                         __global const ushort *restrict wv,   /* Npad x 9*CpadK/2 kept values */
                         __global const uint *restrict meta,   /* Npad/16 x 9*CpadK/32 x 16 */
                         __global const float *restrict bias,  /* Npad */
                         __global ushort *restrict out,        /* NHWC, Cstore channels */
                         const int Cpad, const int CpadK, const int H, const int W, const int Cstore,
                         const int groups_n, const int tiles_x, const int tiles_per_image)
{
    __local uint4 patch[2 * PATCH_CHUNKS];
    __local uint4 stage[STAGES * STAGE_CHUNKS];
    MMA_WARPS(xch_sp, XCH_SP)
    const int gid = get_group_id(0);
    HALO_BLOCK()
    const int ksteps = 9 * nchunks;            /* mma.sp k-steps of a weight row */

    /* weights of step (chunk, tap): k = tap * CpadK + chunk * CK, k-step tap * nchunks + chunk */
    __global const uchar *wbase = (__global const uchar *)(wv + (size_t)n0 * (ksteps * CK / 2));
    const size_t wrow = (size_t)ksteps * CK;   /* bytes of a compressed row */
    __global const uint4 *mbase = (__global const uint4 *)meta + (size_t)(n0 / 16) * ksteps * MCH;

#define LOAD_STEP(s)                                                                                      \
    {                                                                                                     \
        const int chunk_ = (s) / 9, tap_ = (s) - chunk_ * 9, kstep_ = tap_ * nchunks + chunk_;            \
        __local uint4 *sw_ = stage + ((s) % STAGES) * STAGE_CHUNKS;                                        \
        __local uint4 *sm_ = sw_ + W_CHUNKS;                                                              \
        for (int e_ = tid; e_ < W_CHUNKS; e_ += THREADS) SP_COPY_WEIGHTS(sw_, wbase + (size_t)kstep_ * CK, wrow, e_) \
        for (int e_ = tid; e_ < META_CHUNKS; e_ += THREADS) SP_COPY_META(sm_, mbase, ksteps, kstep_, e_)  \
        if (tap_ == 0) HALO_LOAD_PATCH(chunk_)                                                            \
    }

    /* ldmatrix row addresses: A (weights) from the stage, B (block pixel r, shifted by the tap) from the patch */
#define W_ADDR(l) (sw + SWZ2(wn * WTN + cj * 16 + ((l) & 7) + (((l) >> 3) & 1) * 8, (l) >> 4))
#define X_ADDR(l) (pa + SWZ4(HALO_ROW(wm * WTM + pi * 8 + ((l) & 7)), (l) >> 3))

    MMA_ACC(acc, CJ, PI)

    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < nsteps) LOAD_STEP(s)
        CP_COMMIT();
    }
    const int g = lane >> 2, t4 = lane & 3;
    for (int s = 0; s < nsteps; ++s) {
        CP_WAIT();
        barrier(CLK_LOCAL_MEM_FENCE);
        HALO_STEP(s)
        __local uint4 *sw = stage + (s % STAGES) * STAGE_CHUNKS;
        __local const uint *sm = (__local const uint *)(sw + W_CHUNKS);
        uint af[CJ][4], ef[CJ];
        MMA_UNROLL
        for (int cj = 0; cj < CJ; ++cj) {
            LDSM_X4(af[cj], W_ADDR);
            ef[cj] = SP_META_WORD(sm, wn * CJ + cj);
        }
        MMA_UNROLL
        for (int pi = 0; pi < PI; ++pi) {
            uint bf[4];
            LDSM_X4(bf, X_ADDR);
            MMA_UNROLL
            for (int cj = 0; cj < CJ; ++cj) MMA_SP(acc[cj][pi], af[cj], bf, ef[cj]);
        }
        /* refills the stage read in step s - 1 (every warp is past the barrier above), and at a new chunk the patch
         * buffer chunk - 2 used */
        if (s + STAGES - 1 < nsteps) LOAD_STEP(s + STAGES - 1)
        CP_COMMIT();
    }

    /* epilogue: acc[cj][pi][q] is channel .. + g + 8 (q / 2), pixel .. + 2 t4 + q % 2 (tc_epilogue.clh) */
#if POOL
    TC_STORE_POOLED_CHANNEL_ROWS(CJ, PI, n0 + wn * WTN, wm * WTM, HALO_POOLED)
#else
    TC_STORE_CHANNEL_ROWS(CJ, PI, n0 + wn * WTN, wm * WTM, HALO_PIXEL)
#endif
}
