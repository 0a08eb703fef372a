/* conv_wg_halo.cl -- 3x3 convolution on Hopper's wgmma (sm_90a) from halo tiles, with the weights as wgmma's A, in
 * registers straight from global memory, and the block's pixels as its N, read through a descriptor from the input
 * patch in local memory. Local memory holds only the patch: no weight stages.
 *
 *   out[b, y, x, n] = act( bias[n] + sum_{ky, kx, ci} in[b, y + ky - 1, x + kx - 1, ci] * W[n, ci, ky, kx] )
 *
 * Why this orientation: conv_tc_halo.cl with WGMMA = 1 copies every weight stage into local memory by cp.async, and
 * at 48 KB per work-group its copies, not its wgmma, set the pace (BENCHMARKS.md, "the wgmma engines on an NVIDIA
 * H100"). Here a warpgroup's 64 output channels are A (m64), loaded as mma.sync's A fragments (which are wgmma's
 * register fragments of A), one 16-byte load per work-item per k-step, three taps' in registers (the running one, two
 * ahead); the block's BN = 8 TH pixels are B (wgmma's N up to 256), so each weight byte serves up to 256 pixels.
 *
 * Precisions: FP16 and TF32 (m64nNk16 / k8, FP32 sums), FP8 (e4m3 x e4m3, m64nNk32) and INT8 (s8 weights x u8
 * activations, m64nNk32, int32 sums, exact), the 8-bit ones scaled by cs[n] in the epilogue as conv_tc_halo.cl's
 * (ops/eightbit.py); any layer may write 8-bit codes (OUT_FP8, OUT_INT8). Every k-step is 32 bytes whatever the type,
 * so the layout below and the fragments are the same bytes for all four.
 *
 * The block is TH rows x TW = 8 columns of one image's output pixels. Its (TH + 2) x 10 input patch of a chunk of
 * CK channels (64 bytes: 32 FP16, 16 TF32, 64 FP8 / INT8) is stored in 4 planes of 16-byte pieces: piece q of patch
 * pixel pp at uint4 q * PROWS + pp. Pixel rows of 8 are then core matrices: at tap (ky, kx), the 8 pixels of
 * output row y read patch pixels (y + ky) * PW + kx .. + 7, contiguous, 16 bytes apart, and row y + 1's are PW
 * pixels further. So the whole tap is one descriptor: start at pixel ky * PW + kx of the plane, SBO = PW * 16 =
 * 160 bytes (8-pixel groups), LBO = PROWS * 16 (the next 16 bytes of channels), and a k-step (32 bytes of channels)
 * advances it by 2 LBO (WG_ADV).
 *
 *   in:    NHWC, Cpad channels per pixel                                   in[p * Cpad + ci]
 *   wf:    the weights as A fragments (ops/wgmma_halo.py, pack_fragments): for 64-channel block m, chunk c, tap t,
 *          k-step ks, warp w (16 channels 16 w ..) and lane: uint4 wf[((((m * nchunks + c) * 9 + t) * 2 + ks) * 4 + w)
 *          * 32 + lane] holds bytes 4 t4 .. of rows g, g + 8, then bytes 16 + 4 t4 .. of rows g, g + 8 of that
 *          k-step (g = lane / 4, t4 = lane % 4; mma.clh's A layout), zeros past the channels
 *   out:   NHWC, Cstore channels (POOL = 1: the (H/2) x (W/2) pooled image)
 * Work-group: WGS warpgroups (64 WGS output channels) on one block; warpgroup accumulators are 64 channels x BN pixels,
 * m16n8 tiles per warp in the "channel rows" orientation of tc_epilogue.clh (a lane holds one channel of two adjacent
 * pixels; a 2x2 window's four values are in one lane: tiles j, j + 1, columns 2 t4, 2 t4 + 1).
 *
 * Pipeline, per chunk c (patch buffer c % 2; chunk c + 1's patch is copied during chunk c's taps):
 *   wait for chunk c's patch, proxy fence, barrier;
 *   tap 0: wgmma (asynchronous), wait until at most one group runs (this warpgroup's last tap of chunk c - 1 is
 *          done), load tap 2's fragments into the register set tap 8 of chunk c - 1 used;
 *   barrier (every warpgroup is done with chunk c - 1's buffer), copy chunk c + 1's patch into it;
 *   taps 1-8: the same (wgmma of tap t on register set t % 3, wait for tap t - 1, load step s + 2 into set (t+2) % 3).
 * FP8's sums: Hopper's e4m3 wgmma keeps fewer bits than FP32 while it accumulates (measured on an H200 against exact
 * sums: up to 4.6e-3 of the largest sum over 4,608 products; benchmarks/eightbit_sums.py). So, as CUTLASS's FP8
 * GEMMs promote their partial sums into FP32 registers every few k-blocks, PROMOTE = P >= 1 runs each group of P
 * taps of a chunk (taps t with the same t / P; the last group of the 9 may be shorter) into partial accumulators,
 * from zero at the group's first tap (WG_STAGE_RA_Z), and adds them into the FP32 accumulators once the group's
 * last wgmma is waited for: 64 P products a promotion. P = 1 is FP8's default; P = 2 is CUTLASS's and DeepSeek-V3's
 * interval (4 wgmma k-steps of 32, 128 products); PROMOTE = 0 (VGGSERVE_FP8_ACCUMULATE=fast) accumulates across the
 * whole sum in the tensor cores.
 * MMA_EMULATE = 1: wgmma.clh's software model (A exchanged through `xch`, B read through the descriptor's layout).
 * WG_DIAG (benchmarks/wgmma_diag.py; wgmma.clh): 1 no loads after the prologue (neither weights nor patches), 2 no
 * wgmma, 4 no proxy fence.
 */

#ifndef TH
#define TH 16       /* output block height (rows of 8 pixels): BN = 8 TH pixels, wgmma's N; 14 and 28 tile VGG16's
                     * 224, 112, 56, 28 and 14-pixel images without a ragged block */
#endif
#define TW 8        /* output block width: one core matrix of pixels */
#ifndef WGS
#define WGS 1       /* warpgroups per work-group, 64 output channels each */
#endif
#ifndef TF32
#define TF32 0
#endif
#ifndef OUT_F32
#define OUT_F32 0
#endif
#ifndef MMA_EMULATE
#define MMA_EMULATE 0
#endif
#ifndef POOL
#define POOL 0
#endif
#ifndef PROMOTE
#define PROMOTE FP8 /* FP8: each tap's sum in its own accumulators (scale-d 0), added into FP32 ones (below); P > 1:
                     * each P taps' */
#endif
#define WARPS_M (4 * WGS)
#define WARPS_N 1
#define THREADS (128 * WGS)
#define STAGES 2

#include "mma.clh"          /* storage types, cp.async (or their model), frag_a (the model's A) */
#include "tc_halo.clh"      /* PW, PROWS, PATCH_CHUNKS, HALO_PIXEL, HALO_POOLED (TH x TW blocks) */
#include "tc_epilogue.clh"  /* RELU: bias, ReLU, the store in channel rows, the fused pooling */

#if BN != 8 * TH || (TH != 8 && TH != 14 && TH != 16 && TH != 24 && TH != 28 && TH != 32) || (WGS != 1 && WGS != 2)
#error "conv_wg_halo.cl: TH 8, 14, 16, 24, 28 or 32 with BN = 8 TH; WGS 1 or 2"
#endif
#if WG_LBO != PROWS * 16 || WG_SBO != PW * 16 || WG_ADV != 2 * PROWS
#error "conv_wg_halo.cl: WG_LBO = PROWS * 16, WG_SBO = PW * 16, WG_ADV = 2 PROWS (the patch's planes)"
#endif
#if PROMOTE && !FP8
#error "conv_wg_halo.cl: PROMOTE is FP8's (the others accumulate exactly or in FP32)"
#endif
#if PROMOTE < 0 || PROMOTE > 9
#error "conv_wg_halo.cl: PROMOTE is 0 (no promotion) or 1 to 9 taps a promotion"
#endif
#define KB 64                      /* bytes of channels per chunk and per tap's wgmma stage */
#define CHUNKS 4
#define CK (KB / ELEM)             /* channels per chunk */
#define KSTEPS 2                   /* 32-byte k-steps per tap */
#define NJ (BN / 8)                /* n8 tiles of pixels per warp */
#define BK CK
#include "wgmma.clh"

__kernel __attribute__((reqd_work_group_size(THREADS, 1, 1)))
void conv_wg_halo(__global const elem_t *restrict in,   /* NHWC, Cpad channels */
                  __global const uint4 *restrict wf,    /* the weights' A fragments */
                  __global const float *restrict bias,  /* 64 WGS groups_n */
#if EIGHT_BIT
                  __global const float *restrict cs,    /* 64 WGS groups_n: s_in * s_w[n] (ops/eightbit.py) */
#endif
#if OUT_EIGHT_BIT
                  const float out_scale_inv,            /* 1 / s_out: the next layer's codes */
#endif
                  __global out_t *restrict out,         /* NHWC, Cstore channels */
                  const int Cpad, const int CpadK, const int H, const int W, const int Cstore,
                  const int groups_n, const int tiles_x, const int tiles_per_image)
{
    __local uint4 patch[2 * PATCH_CHUNKS];
    MMA_WARPS(xch, 6)
    const int gid = get_group_id(0);
    const int nb = gid % groups_n, tile = gid / groups_n;
    const int b = tile / tiles_per_image, t_in = tile - b * tiles_per_image;
    const int y0 = (t_in / tiles_x) * TH, x0 = (t_in % tiles_x) * TW;
    const int nchunks = CpadK / CK, nsteps = 9 * nchunks;
    const size_t img = (size_t)b * H * W;
    const int wg = warp >> 2;
    __global const uint4 *wq = wf + (size_t)(nb * WGS + wg) * nsteps * KSTEPS * 128 + (tid & 127);

    /* chunk_'s patch into its buffer by cp.async, in planes of 16-byte pieces (zeros outside the image, past Cpad) */
#define LOAD_PATCH(chunk_)                                                                                \
    {                                                                                                     \
        __local uint4 *p_ = patch + ((chunk_) & 1) * PATCH_CHUNKS;                                        \
        const int ci_ = (chunk_) * CK;                                                                    \
        for (int e = tid; e < PATCH_CHUNKS; e += THREADS) {                                               \
            const int pr = e >> 2, pc = e & 3;                                                            \
            const int iy = y0 - 1 + pr / PW, ix = x0 - 1 + pr % PW, cc = ci_ + pc * VEC;                  \
            const int ok = iy >= 0 && iy < H && ix >= 0 && ix < W && cc < Cpad;                           \
            CP_ASYNC16(p_ + pc * PROWS + pr, in + (ok ? (img + (size_t)iy * W + ix) * Cpad + cc : 0), ok);   \
        }                                                                                                 \
    }
    /* step s_'s A fragments (its two k-steps) into register set AF_ */
#define LOAD_W(AF_, s_)                                                                                   \
    _Pragma("unroll") for (int ks_ = 0; ks_ < KSTEPS; ++ks_) {                                            \
        const uint4 v_ = wq[((size_t)(s_) * KSTEPS + ks_) * 128];                                         \
        AF_[ks_][0] = v_.x;                                                                               \
        AF_[ks_][1] = v_.y;                                                                               \
        AF_[ks_][2] = v_.z;                                                                               \
        AF_[ks_][3] = v_.w;                                                                               \
    }
    /* tap t_ (a constant) of chunk c on patch pa: its wgmma, the wait for tap t_ - 1's, step + 2's fragments */
#define TAP(t_)                                                                                           \
    {                                                                                                     \
        WG_STAGE_RA(acc, af[(t_) % 3], pa + ((t_) / 3) * PW + (t_) % 3);                                  \
        WG_WAIT(acc, 1);                                                                                  \
        if (WG_COPIES && c * 9 + (t_) + 2 < nsteps) LOAD_W(af[((t_) + 2) % 3], c * 9 + (t_) + 2)         \
    }

#if PROMOTE
    /* each group of PROMOTE taps' sum (2 k-steps, 64 products a tap) into part0, from zero (scale-d 0) at its first
     * tap; a later tap of the group waits for the tap before it (its fragments' registers are reloaded next); after
     * the group's last tap (t_ % PROMOTE == PROMOTE - 1, or tap 8) part0 is waited for and added into acc by the
     * FP32 pipe. The fragments two taps ahead are loaded while a wgmma runs, and the other work-groups on the SM
     * overlap the wait. t_ is a constant, so each tap keeps one of the two wgmma forms. (Two partial sets, one tap's
     * wgmma running while the other's is added, took a third set of accumulators: 252 registers at 14-row blocks
     * against 166, and were 26% slower: BENCHMARKS.md) */
#define ADD_PART(P_)                                                                                      \
    _Pragma("unroll") for (int j_ = 0; j_ < NJ; ++j_)                                                     \
    _Pragma("unroll") for (int e_ = 0; e_ < 4; ++e_) acc[0][j_][e_] += P_[0][j_][e_];
#define TAP_P(t_)                                                                                         \
    {                                                                                                     \
        if ((t_) % PROMOTE == 0) {                                                                        \
            WG_STAGE_RA_Z(part0, af[(t_) % 3], pa + ((t_) / 3) * PW + (t_) % 3);                         \
        } else {                                                                                          \
            WG_STAGE_RA(part0, af[(t_) % 3], pa + ((t_) / 3) * PW + (t_) % 3);                           \
            WG_WAIT(part0, 1);                                                                            \
        }                                                                                                 \
        if (WG_COPIES && c * 9 + (t_) + 2 < nsteps) LOAD_W(af[((t_) + 2) % 3], c * 9 + (t_) + 2)         \
        if ((t_) % PROMOTE == PROMOTE - 1 || (t_) == 8) {                                                 \
            WG_WAIT(part0, 0);                                                                            \
            ADD_PART(part0)                                                                               \
            PIN_ACC();                                                                                    \
        }                                                                                                 \
    }
    /* PROMOTE > 1: the adds into acc done here, before the next wgmma into part0: an empty asm that reads and writes
     * acc keeps the compiler from sinking them past it, which would hold a copy of part0 (clang did at PROMOTE = 2:
     * 168 registers against 115 at 8-row blocks, ptx_check.py). PROMOTE = 1 is left as measured (with the pin clang
     * gives it 108 registers, not 115: untried on a GPU) */
#if MMA_EMULATE || PROMOTE == 1
#define PIN_ACC() ((void)0)
#else
#define PIN_ACC() asm volatile("" : WG_ACC_OPS(acc) :: "memory")
#endif
    MMA_ACC(part0, 1, NJ)
#endif

    MMA_ACC(acc, 1, NJ)
    uint af[3][KSTEPS][4];
    LOAD_PATCH(0)
    CP_COMMIT();
    LOAD_W(af[0], 0)
    LOAD_W(af[1], 1)
    _Pragma("unroll 1")
    for (int c = 0; c < nchunks; ++c) {
        __local uint4 *pa = patch + (c & 1) * PATCH_CHUNKS;
        WG_CP_WAIT(0);
        WG_PROXY();
        barrier(CLK_LOCAL_MEM_FENCE);
#if PROMOTE
        TAP_P(0)
#else
        TAP(0)
#endif
        barrier(CLK_LOCAL_MEM_FENCE);
        if (WG_COPIES && c + 1 < nchunks) LOAD_PATCH(c + 1)
        CP_COMMIT();
#if PROMOTE
        TAP_P(1) TAP_P(2) TAP_P(3) TAP_P(4) TAP_P(5) TAP_P(6) TAP_P(7) TAP_P(8)
#else
        TAP(1) TAP(2) TAP(3) TAP(4) TAP(5) TAP(6) TAP(7) TAP(8)
#endif
    }
#if !PROMOTE
    WG_WAIT(acc, 0);
#endif

    const int g = lane >> 2, t4 = lane & 3;
    const int n0 = (nb * WGS + wg) * 64 + (warp & 3) * 16;
#if POOL
    TC_STORE_POOLED_CHANNEL_ROWS(1, NJ, n0, 0, HALO_POOLED)
#else
    TC_STORE_CHANNEL_ROWS(1, NJ, n0, 0, HALO_PIXEL)
#endif
}
