/* conv_tc.cl -- convolution (and fully connected layers) as an implicit GEMM on NVIDIA tensor cores (mma.sync).
 *
 *   out[p, n] = act( bias[n] + sum_k  A[p, k] * Wt[n, k] )       p = pixel (b*H + y)*W + x,  n = output channel
 *   A[p, k]   = in[b, y + ky - PAD, x + kx - PAD, ci]  (NHWC, zero outside the image; never stored anywhere)
 *   k         = (ky*KS + kx)*Cpad + ci                  (ci fastest: one 16-byte chunk = VEC channels of one tap)
 *
 * Storage ("elem"): FP16 (TF32 = 0: half, mma.m16n8k16 f16 x f16 -> f32), FP32 (TF32 = 1: float, mma.m16n8k8
 * tf32 x tf32 -> f32, every operand already rounded by cvt.rna.tf32.f32: the epilogue rounds what it stores, the
 * host rounds the weights, the input conversion the input), FP8 (FP8 = 1: e4m3 codes, one byte, mma.m16n8k32
 * e4m3 x e4m3 -> f32) or INT8 (INT8 = 1: u8 activation codes x s8 weight codes, one byte each, mma.m16n8k32 u8 x s8
 * -> s32). Accumulation is FP32, INT8's int32 (exact). Sizes in the K direction are in bytes (KB: 32 bytes of k per
 * mma, i.e. k16, k8 or k32), so the tiles, the swizzle and ldmatrix are the same at every precision (mma.clh).
 * 8-bit is scaled (TensorRT's recipe): Wt holds codes of W[n, k] / s_w[n] (s_w[n] = amax |W[n]| / 448 FP8, / 127
 * INT8), `in` codes of x / s_in, and the epilogue takes cs[n] = s_in * s_w[n]:
 *   out = act( sum_k A[p, k] Wt[n, k] * cs[n] + bias[n] )      (INT8: the int sum converted to float first)
 * The output's storage is the input's (8-bit input: FP16), or float (OUT_F32: logits), or 8-bit codes of out / s_out
 * (OUT_FP8: e4m3, OUT_INT8: u8, with out_scale_inv = 1 / s_out, whatever the input: FP16 in, 8-bit out is a first
 * convolution that stays FP16); tc_epilogue.clh.
 *   in:   NHWC, Cpad channels per pixel (a multiple of VEC, pad channels zero)           in[p * Cpad + ci]
 *   wt:   Npad x Kpad, k contiguous ("OHWI", zero-padded to the tiles; re-laid out at load) wt[n * Kpad + k]
 *   bias: Npad floats (zero past the layer's channels); FP8 and INT8 also cs: Npad floats
 *   out:  NHWC, Cstore channels per pixel (Cstore = output channels rounded up to 16 bytes of the output's storage:
 *         8 FP16, 4 TF32 or float, 16 e4m3 or u8)                                         out[p * Cstore + n]
 * A fully connected layer is KS = 1, PAD = 0, H = W = 1 (a pixel is an image, Cpad its input features).
 *
 *        N (channels) ->     work-group (gn, gm) computes a BM x BN tile of out; its K loop walks BK-deep tiles,
 *      +-----------+         STAGES of them in flight: cp.async copies tile t + STAGES - 1 while tile t is multiplied
 *   M  |  BM x BN  |           As[stage][BM rows][KB bytes]  <- A rows (pixels), gathered with zero fill
 * (px) +-----------+           Bs[stage][BN rows][KB bytes]  <- Wt rows (channels), dense
 * Local rows are KB bytes (2, 4 or 8 chunks of 16 bytes); chunk c of row r lives at chunk c ^ f(r) (XOR swizzle), so
 * the 8 row addresses of one ldmatrix phase fall in 8 distinct bank groups and no padding is needed.
 * Warps: WARPS_M x WARPS_N, each owning a WTM x WTN block = MI x NJ mma tiles of 16 x 8; fragments come from local
 * memory by ldmatrix.x4 (A: 16 rows x 32 bytes; B: 16 channels x 32 bytes, i.e. two n-tiles), one mma per 32 bytes
 * of k (k16 in FP16, k8 in TF32, k32 in FP8): the fragment layouts of the three instructions coincide byte for byte.
 * Epilogue: (scale,) bias + ReLU fused, two adjacent channels per store. SPLITK = 1: group z = get_group_id(1) sums
 * its k-tiles only and stores raw FP32 sums (INT8: the int32 sums' bits) to part[(z * NPIX + p) * Cstore + n];
 * tc_reduce adds them up (INT8: as ints, exactly) and applies the epilogue.
 *
 * MMA_EMULATE = 1 replaces cp.async, ldmatrix and mma.sync by an exact software model of their data movement
 * (lanes = 32 consecutive work-items, fragments exchanged through local memory), so the tiling and fragment
 * bookkeeping of this file run, and are tested against numpy, on any OpenCL device (e.g. PoCL in CI).
 *
 * WGMMA = 1 (Hopper, sm_90a; wgmma.clh): each warpgroup of 4 warps multiplies its 64 rows by the whole BN-wide B tile
 * with wgmma.mma_async straight from local memory (no ldmatrix), the tiles laid out as wgmma's core matrices instead
 * of the XOR swizzle. Shape: WARPS_N = 1, WARPS_M = BM / 16 (a multiple of 4: one m16 tile per warp, so the epilogue
 * is unchanged), BN = 64, 128, 192 or 256; FP16 or TF32. A stage's wgmma run while the next tiles are copied; before a
 * stage is refilled every warpgroup has waited for the wgmma that read it (WG_WAIT, then the barrier). The program is
 * built from the driver's PTX with the placeholders replaced (vggserve/runtime/ptx.py); emulated like the rest.
 */

#ifndef BM
#define BM 128      /* work-group tile in M (pixels), e.g. 64, 128, 256 */
#endif
#ifndef BN
#define BN 128      /* work-group tile in N (output channels), e.g. 64, 128, 256 */
#endif
#ifndef WARPS_M
#define WARPS_M 2   /* warps along M; WTM = BM / WARPS_M must be a multiple of 16 */
#endif
#ifndef WARPS_N
#define WARPS_N 2   /* warps along N; WTN = BN / WARPS_N must be a multiple of 16 */
#endif
#ifndef STAGES
#define STAGES 3    /* k-tiles in flight (local memory: STAGES * (BM + BN) * KB bytes <= 48 KB) */
#endif
#ifndef KB
#define KB 64       /* bytes of one local row per k-tile: 32, 64 or 128 (2, 4 or 8 chunks of 16 bytes) */
#endif
#ifndef TF32
#define TF32 0      /* 0: FP16 storage and f16 mma; 1: FP32 storage and tf32 mma */
#endif
#ifndef FP8
#define FP8 0       /* 1: e4m3 storage and e4m3 mma, scaled by cs[n] in the epilogue */
#endif
#ifndef OUT_FP8
#define OUT_FP8 0   /* 1: out is e4m3 codes of out * out_scale_inv, whatever the storage */
#endif
#ifndef INT8
#define INT8 0      /* 1: u8 activations x s8 weights, int32 sums, scaled by cs[n] in the epilogue */
#endif
#ifndef OUT_INT8
#define OUT_INT8 0  /* 1: out is u8 codes of out * out_scale_inv (FP16 or INT8 input) */
#endif
#ifndef KS
#define KS 3        /* kernel size: 3 (padding PAD) or 1 (fully connected) */
#endif
#ifndef PAD
#define PAD 1
#endif
#ifndef OUT_F32
#define OUT_F32 0   /* 1: out is float whatever the storage (logits) */
#endif
#ifndef SPLITK
#define SPLITK 0
#endif
#ifndef MMA_EMULATE
#define MMA_EMULATE 0
#endif
#ifndef WGMMA
#define WGMMA 0
#endif
#ifndef WG_INFLIGHT
#define WG_INFLIGHT 0   /* WGMMA: wgmma groups left running across the next barrier (0 or 1; 1: 3+ stages) */
#endif

#define THREADS (32 * WARPS_M * WARPS_N)
#define CHUNKS (KB / 16)           /* chunks per local row */
#define BK (KB / ELEM)             /* k per k-tile */
#define KSTEPS (KB / 32)           /* mma k-steps per k-tile */
#define WTM (BM / WARPS_M)
#define WTN (BN / WARPS_N)
#define MI (WTM / 16)              /* m16 tiles per warp */
#define NJ (WTN / 8)               /* n8 tiles per warp (even) */
#define A_ITERS (BM * CHUNKS / THREADS)
#define B_ITERS (BN * CHUNKS / THREADS)
#define STAGE_CHUNKS ((BM + BN) * CHUNKS)

#if WGMMA && (FP8 || INT8)
#error "WGMMA: FP16 or TF32 (FP8 and INT8 run on mma.sync)"
#endif
#if WGMMA                     /* wgmma's core matrices (wgmma.clh) */
#define SWZ(r, c) WG_CORE(r, c)
/* work-item t copies rows (t % 8) + 8 (t / (8 CHUNKS)) + i THREADS / CHUNKS at chunk (t / 8) % CHUNKS: its local
 * chunk is then WG_CORE(row, chunk) = t + i THREADS, 8 work-items filling one core matrix (no bank conflicts) */
#define TC_ROW_OF(tid_, CH_) (((tid_) & 7) + 8 * ((tid_) / (8 * (CH_))))
#define TC_CHUNK_OF(tid_, CH_) (((tid_) >> 3) % (CH_))
#if WARPS_N != 1 || BM != 16 * WARPS_M || WARPS_M % 4 || BN % 64 || BN > 256 || STAGES < 2 + WG_INFLIGHT
#error "WGMMA: WARPS_N = 1, WARPS_M = BM / 16 (a multiple of 4), BN 64 to 256 by 64, STAGES >= 2 + WG_INFLIGHT"
#endif
#elif CHUNKS == 2             /* mma.clh's swizzle of rows of CHUNKS chunks */
#define SWZ SWZ2
#elif CHUNKS == 4
#define SWZ SWZ4
#elif CHUNKS == 8
#define SWZ SWZ8
#else
#error "KB must be 32, 64 or 128"
#endif
#if (BM * CHUNKS) % THREADS || (BN * CHUNKS) % THREADS || WTM % 16 || WTN % 16
#error "tile shape: BM*CHUNKS and BN*CHUNKS must be multiples of the work-group size, WTM and WTN of 16"
#endif

#include "mma.clh"          /* storage types, TF32 rounding, cp.async / ldmatrix / mma.sync (or their model) */
#include "tc_gather.clh"    /* the activation rows gathered from NHWC (implicit GEMM) */
#include "tc_epilogue.clh"  /* RELU (default 1): bias, ReLU and the store of the accumulators */
#include "wgmma.clh"        /* WGMMA: the core-matrix layout, wgmma placeholders (or their model) */

__kernel __attribute__((reqd_work_group_size(THREADS, 1, 1)))
void conv_tc(__global const elem_t *restrict in,   /* NHWC, Cpad channels */
             __global const elem_t *restrict wt,   /* Npad x Kpad */
             __global const float *restrict bias,  /* Npad */
#if EIGHT_BIT
             __global const float *restrict cs,    /* Npad: s_in * s_w[n] */
#endif
#if OUT_EIGHT_BIT
             const float out_scale_inv,            /* 1 / s_out */
#endif
#if SPLITK
             __global float *restrict out,         /* splits x NPIX x Cstore raw partial sums */
#else
             __global out_t *restrict out,         /* NHWC, Cstore channels */
#endif
             const int Cpad, const int H, const int W, const int NPIX, const int Cstore, const int Kpad,
             const int groups_n, const int ktiles_per_split)
{
    __local uint4 smem[STAGES * STAGE_CHUNKS];
    MMA_WARPS(xch, 6)
    const int gid = get_group_id(0);
    const int n0 = (gid % groups_n) * BN, m0 = (gid / groups_n) * BM;
    const int ntiles_all = Kpad / BK;
    const int kt0 = get_group_id(1) * ktiles_per_split;
    const int nt = min(ntiles_all, kt0 + ktiles_per_split) - kt0;
    const int K = KS * KS * Cpad;
    const int HW = H * W;

    /* this work-item's A chunks: rows r_i = r_0 + i * (THREADS / CHUNKS) at chunk c (tc_gather.clh: r_0 = tid /
     * CHUNKS, c = tid % CHUNKS, or WGMMA's order) */
    const int c = TC_CHUNK_OF(tid, CHUNKS);
    int aoff[A_ITERS];
    uint amask[A_ITERS];
    for (int i = 0; i < A_ITERS; ++i) TC_GATHER_ROW(i, m0, CHUNKS)
    TC_GATHER_START(kt0 * BK + c * VEC)
    /* local chunk of row r_0; row r_i adds i * THREADS (the swizzle's period divides THREADS / CHUNKS, so the XOR
     * pattern repeats; WGMMA: THREADS / CHUNKS rows are whole 8-row groups) */
    const uint sa_row0 = SWZ(TC_ROW_OF(tid, CHUNKS), c);
    __global const uchar *wrow =
        (__global const uchar *)(wt + (size_t)(n0 + TC_ROW_OF(tid, CHUNKS)) * Kpad + c * VEC) + (size_t)kt0 * KB;
    const size_t wstep = (size_t)(THREADS / CHUNKS) * Kpad * ELEM;  /* bytes between one work-item's B rows */

#define A_ADDR(l) (sa + SWZ(mrow0 + ((l) & 7) + (((l) >> 3) & 1) * 8, ks * 2 + ((l) >> 4)))
#define B_ADDR(l) (sb + SWZ(wn * WTN + nj2 * 16 + ((l) & 7) + ((l) >> 4) * 8, ks * 2 + (((l) >> 3) & 1)))

#define LOAD_STAGE(stage)                                                                                 \
    {                                                                                                     \
        __local uint4 *sa_ = smem + (stage) * STAGE_CHUNKS + sa_row0, *sb_ = sa_ + BM * CHUNKS;           \
        TC_GATHER_COPY(sa_, A_ITERS)                                                                      \
        for (int i = 0; i < B_ITERS; ++i) CP_ASYNC16(sb_ + i * THREADS, wrow + i * wstep, 1);             \
        wrow += KB;                                                                                       \
        ci += BK;                                                                                         \
        delta += BK;                                                                                      \
        if (ci >= Cpad) {                                                                                 \
            do { ci -= Cpad; ++tap; } while (ci >= Cpad);                                                 \
            delta = TC_TAP_DELTA(tap, ci);                                                                \
        }                                                                                                 \
    }

    MMA_ACC(acc, MI, NJ)

#if WGMMA
    /* copies run LEAD stages ahead; a stage is refilled once the wgmma that read it, WG_INFLIGHT + 1 stages back,
     * are done in every warpgroup (each waits until at most WG_INFLIGHT of its groups run, then the barrier) */
#define LEAD (STAGES - 1 - WG_INFLIGHT)
    for (int s = 0; s < LEAD; ++s) {
        if (s < nt) LOAD_STAGE(s)
        CP_COMMIT();
    }
    for (int t = 0; t < nt; ++t) {
        WG_CP_WAIT(LEAD - 1);  /* stage t has landed */
        WG_PROXY();
        WG_WAIT(acc, WG_INFLIGHT);
        barrier(CLK_LOCAL_MEM_FENCE);
        __local uint4 *sa = smem + (t % STAGES) * STAGE_CHUNKS, *sb = sa + BM * CHUNKS;
        WG_STAGE(acc, sa + WG_CORE((warp >> 2) * 64, 0), sb);
        if (WG_COPIES && t + LEAD < nt) LOAD_STAGE((t + LEAD) % STAGES)
        CP_COMMIT();
    }
    WG_WAIT(acc, 0);
#else
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < nt) LOAD_STAGE(s)
        CP_COMMIT();
    }
    for (int t = 0; t < nt; ++t) {
        CP_WAIT();
        barrier(CLK_LOCAL_MEM_FENCE);
        __local uint4 *sa = smem + (t % STAGES) * STAGE_CHUNKS, *sb = sa + BM * CHUNKS;
        MMA_DENSE_STAGE(acc, MI, NJ, KSTEPS)
        /* the stage refilled now was last read in iteration t - 1, which every warp has left (the barrier above);
         * issued after this tile's mma so that its address arithmetic overlaps the tensor cores' work */
        if (t + STAGES - 1 < nt) LOAD_STAGE((t + STAGES - 1) % STAGES)
        CP_COMMIT();
    }
#endif

    /* epilogue: lane holds rows g and g + 8, channels 2 * t4 and 2 * t4 + 1 of each 16 x 8 tile (tc_epilogue.clh) */
    const int g = lane >> 2, t4 = lane & 3;
#define PIXEL(r)                                                                                          \
    const int p = m0 + (r);                                                                               \
    if (p >= NPIX) continue;
#if SPLITK
    __global float *part = out + (size_t)get_group_id(1) * NPIX * Cstore;
#if INT8
#define STORE_PART(p, n, v) vstore2(as_float2(v), 0, part + (size_t)(p) * Cstore + (n))  /* the int sums' bits */
#else
#define STORE_PART(p, n, v) vstore2((v), 0, part + (size_t)(p) * Cstore + (n))
#endif
    TC_STORE_PIXEL_ROWS(MI, NJ, wm * WTM, n0 + wn * WTN, PIXEL, STORE_PART)
#else
    TC_STORE_PIXEL_ROWS(MI, NJ, wm * WTM, n0 + wn * WTN, PIXEL, TC_STORE_ACT2)
#endif
}

/* Split K's second step: out[p, n] = act(bias[n] + sum_z part[z, p, n]) for p < NPIX, n < Cstore (one work-item
 * per element; the host rounds the global size up and the kernel skips the rest). 8-bit in or out: the sum first
 * (INT8: of the int sums, exactly, then converted to float), then conv_tc's scaled epilogue (tc_epilogue.clh), as
 * one pass does. */
__kernel void tc_reduce(__global const float *restrict part, __global const float *restrict bias,
#if EIGHT_BIT
                        __global const float *restrict cs,
#endif
#if OUT_EIGHT_BIT
                        const float out_scale_inv,
#endif
                        __global out_t *restrict out, const int NPIX, const int Cstore, const int splits)
{
    const int idx = get_global_id(0);
    const int total = NPIX * Cstore;
    if (idx >= total) return;
#if INT8
    int si = 0;
    for (int z = 0; z < splits; ++z) si += as_int(part[(size_t)z * total + idx]);
    const float s = TC_SCALED1((float)si, idx % Cstore);
#elif FP8 || OUT_EIGHT_BIT
    float s = 0.0f;
    for (int z = 0; z < splits; ++z) s += part[(size_t)z * total + idx];
    s = TC_SCALED1(s, idx % Cstore);
#else
    float s = bias[idx % Cstore];
    for (int z = 0; z < splits; ++z) s += part[(size_t)z * total + idx];
#if RELU
    s = fmax(s, 0.0f);
#endif
#endif
    STORE1(out, idx, s);
}
