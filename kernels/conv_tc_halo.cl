/* conv_tc_halo.cl -- 3x3 convolution on NVIDIA tensor cores from halo tiles: each input patch is fetched once per
 * channel chunk and serves all nine taps.
 *
 *   out[b, y, x, n] = act( bias[n] + sum_{ky, kx, ci} in[b, y + ky - 1, x + kx - 1, ci] * Wt[n, (ky*3 + kx)*CpadK + ci] )
 *
 * Layouts and storage as conv_tc.cl (NHWC activations, FP16 or TF32; mma.clh), except the weights' k index:
 * taps of CpadK channels each, CpadK = Cpad rounded up to a chunk (CK = 64 bytes of channels), zero-padded.
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
 * at an even pixel (TH even, TW a multiple of 8), so each 2x2 window lies within one block, and within one warp:
 * an accumulator fragment holds rows g and g + 8 of 16 GEMM rows (lane 4g + t4), i.e.
 *   TW = 8:            two image rows of 8 pixels: the window's upper pair is (g, g ^ 1) of half 0, the lower the
 *                      same of half 1;
 *   TW = 16, 32, ...:  16 pixels of one image row: the row below is fragment mi + TW/16 of the same warp (when the
 *                      warp's rows WTM are a multiple of 2 * TW);
 * pixel g ^ 1 sits in lane ^ 4, read with one shfl.sync.bfly per value (its model: local memory). The max is taken
 * before the bias and the ReLU (both monotonic and per channel, so this equals pooling the stored outputs, bit for
 * bit), and even-g lanes store one pixel of the pooled output.
 */

#ifndef TH
#define TH 8        /* output block height (pixels) */
#endif
#ifndef TW
#define TW 16       /* output block width (pixels), a multiple of 8: an ldmatrix phase reads 8 pixels of one row */
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
#ifndef RELU
#define RELU 1
#endif
#ifndef OUT_F32
#define OUT_F32 0
#endif
#ifndef MMA_EMULATE
#define MMA_EMULATE 0
#endif
#ifndef POOL
#define POOL 0      /* 1: a 2x2/2 max-pool fused into the store (TH even; TW 8, or a multiple of 16 with WTM of 2*TW) */
#endif

#include "mma.clh"  /* storage types, TF32 rounding, cp.async / ldmatrix / mma.sync (or their model) */

#define KB 64                      /* bytes of a chunk of channels (a local row) */
#define CHUNKS 4                   /* 16-byte pieces per row */
#define CK (KB / ELEM)             /* channels per chunk: 32 FP16 or 16 TF32 */
#define KSTEPS 2                   /* mma k-steps per row (32 bytes each) */
#define BM (TH * TW)
#define PW (TW + 2)
#define PROWS ((TH + 2) * PW)      /* pixels of a patch */
#define THREADS (32 * WARPS_M * WARPS_N)
#define WTM (BM / WARPS_M)
#define WTN (BN / WARPS_N)
#define MI (WTM / 16)
#define NJ (WTN / 8)
#define B_ITERS (BN * CHUNKS / THREADS)
#define PATCH_CHUNKS (PROWS * CHUNKS)
#define SWZ(r, c) ((r) * 4 + ((c) ^ (((r) >> 1) & 3)))
#if TW % 8 || WTM % 16 || WTN % 16 || (BN * CHUNKS) % THREADS
#error "tile shape: TW a multiple of 8, WTM and WTN of 16, BN*4 of the work-group size"
#endif
#if POOL && (TH % 2 || !(TW == 8 || (TW % 16 == 0 && WTM % (2 * TW) == 0)))
#error "POOL: TH even, and TW 8 or a multiple of 16 with WTM a multiple of 2*TW"
#endif

#if POOL  /* the value of lane ^ 4: fragment row g ^ 1, the pixel beside this one */
#if MMA_EMULATE
inline float2 pool_neighbour(float2 v, __local uint *x, int lane) {
    x[lane * 6] = as_uint(v.x);
    x[lane * 6 + 1] = as_uint(v.y);
    barrier(CLK_LOCAL_MEM_FENCE);
    const float2 r = (float2)(as_float(x[(lane ^ 4) * 6]), as_float(x[(lane ^ 4) * 6 + 1]));
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}
#define NEIGHBOUR(v) pool_neighbour((v), xch, lane)
#else
inline float shfl_xor4(float v) {
    uint r;
    asm volatile("shfl.sync.bfly.b32 %0, %1, 4, 0x1f, 0xffffffff;\n" : "=r"(r) : "r"(as_uint(v)));
    return as_float(r);
}
#define NEIGHBOUR(v) ((float2)(shfl_xor4((v).x), shfl_xor4((v).y)))
#endif
#if TW == 8
#define POOL_PAIRS MI    /* (upper, lower) fragment pairs per warp */
#define POOL_HALVES 1
#else
#define ROWF (TW / 16)   /* fragments per image row */
#define POOL_PAIRS (MI / 2)
#define POOL_HALVES 2
#endif
#endif

__kernel __attribute__((reqd_work_group_size(THREADS, 1, 1)))
void conv_tc_halo(__global const elem_t *restrict in,   /* NHWC, Cpad channels */
                  __global const elem_t *restrict wt,   /* Npad x 9*CpadK */
                  __global const float *restrict bias,  /* Npad */
                  __global out_t *restrict out,         /* NHWC, Cstore channels */
                  const int Cpad, const int CpadK, const int H, const int W, const int Cstore,
                  const int groups_n, const int tiles_x, const int tiles_per_image)
{
    __local uint4 patch[2 * PATCH_CHUNKS];
    __local uint4 bs[STAGES * BN * CHUNKS];
#if MMA_EMULATE
    __local uint xch_all[THREADS * 6];
#endif
    const int tid = get_local_id(0);
    const int lane = tid & 31, warp = tid >> 5;
    const int wm = warp % WARPS_M, wn = warp / WARPS_M;
#if MMA_EMULATE
    __local uint *xch = xch_all + warp * 32 * 6;
#endif
    const int gid = get_group_id(0);
    const int n0 = (gid % groups_n) * BN;
    const int tile = gid / groups_n;
    const int b = tile / tiles_per_image, t_in = tile - b * tiles_per_image;
    const int y0 = (t_in / tiles_x) * TH, x0 = (t_in % tiles_x) * TW;
    const int nchunks = CpadK / CK;
    const int nsteps = nchunks * 9;
    const size_t Kw = (size_t)9 * CpadK;
    const size_t img = (size_t)b * H * W;

    /* weights: this work-item's rows tid / CHUNKS + i * (THREADS / CHUNKS), piece c = tid % CHUNKS */
    const int c = tid % CHUNKS;
    __global const uchar *wrow = (__global const uchar *)(wt + (size_t)(n0 + tid / CHUNKS) * Kw + c * VEC);
    const size_t wstep = (size_t)(THREADS / CHUNKS) * Kw * ELEM;
    const uint bs_row0 = SWZ(tid / CHUNKS, c);

    /* step s = (chunk s / 9, tap s % 9): its weights (and, at tap 0, its chunk's patch) into stage s % STAGES */
#define LOAD_STEP(s)                                                                                      \
    {                                                                                                     \
        const int chunk_ = (s) / 9, tap_ = (s) - chunk_ * 9;                                              \
        __local uint4 *b_ = bs + ((s) % STAGES) * BN * CHUNKS + bs_row0;                                  \
        __global const uchar *w_ = wrow + ((size_t)tap_ * CpadK + (size_t)chunk_ * CK) * ELEM;            \
        for (int i = 0; i < B_ITERS; ++i) CP_ASYNC16(b_ + i * THREADS, w_ + i * wstep, 1);                \
        if (tap_ == 0) {                                                                                  \
            __local uint4 *p_ = patch + (chunk_ & 1) * PATCH_CHUNKS;                                      \
            const int ci_ = chunk_ * CK;                                                                  \
            for (int e = tid; e < PATCH_CHUNKS; e += THREADS) {                                           \
                const int pr = e / CHUNKS, pc = e - pr * CHUNKS;                                          \
                const int iy = y0 - 1 + pr / PW, ix = x0 - 1 + pr % PW, cc = ci_ + pc * VEC;              \
                const int ok = iy >= 0 && iy < H && ix >= 0 && ix < W && cc < Cpad;                       \
                CP_ASYNC16(p_ + SWZ(pr, pc), in + (ok ? (img + (size_t)iy * W + ix) * Cpad + cc : 0), ok); \
            }                                                                                             \
        }                                                                                                 \
    }

    /* ldmatrix row addresses: A from the patch (pixel of output row r shifted by the tap), B from the stage */
#define A_ADDR(l) (pa + SWZ(((mrow0 + ((l) & 7) + (((l) >> 3) & 1) * 8) / TW + ky) * PW +                  \
                             ((mrow0 + ((l) & 7) + (((l) >> 3) & 1) * 8) % TW) + kx, ks * 2 + ((l) >> 4)))
#define B_ADDR(l) (sb + SWZ(wn * WTN + nj2 * 16 + ((l) & 7) + ((l) >> 4) * 8, ks * 2 + (((l) >> 3) & 1)))

    float acc[MI][NJ][4];
    for (int mi = 0; mi < MI; ++mi)
        for (int nj = 0; nj < NJ; ++nj)
            for (int e = 0; e < 4; ++e) acc[mi][nj][e] = 0.0f;

    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < nsteps) LOAD_STEP(s)
        CP_COMMIT();
    }
    for (int s = 0; s < nsteps; ++s) {
        CP_WAIT();
        barrier(CLK_LOCAL_MEM_FENCE);
        const int chunk = s / 9, tap = s - chunk * 9, ky = tap / 3, kx = tap - ky * 3;
        __local uint4 *pa = patch + (chunk & 1) * PATCH_CHUNKS;
        __local uint4 *sb = bs + (s % STAGES) * BN * CHUNKS;
#pragma unroll
        for (int ks = 0; ks < KSTEPS; ++ks) {
            uint af[MI][4], bf[NJ][2];
#pragma unroll
            for (int mi = 0; mi < MI; ++mi) {
                const int mrow0 = wm * WTM + mi * 16;
                LDSM_X4(af[mi], A_ADDR);
            }
#pragma unroll
            for (int nj2 = 0; nj2 < NJ / 2; ++nj2) {
                uint r[4];
                LDSM_X4(r, B_ADDR);
                bf[2 * nj2][0] = r[0];
                bf[2 * nj2][1] = r[1];
                bf[2 * nj2 + 1][0] = r[2];
                bf[2 * nj2 + 1][1] = r[3];
            }
#pragma unroll
            for (int mi = 0; mi < MI; ++mi)
#pragma unroll
                for (int nj = 0; nj < NJ; ++nj) MMA(acc[mi][nj], af[mi], bf[nj]);
        }
        /* refills the stage read in step s - 1 (every warp is past the barrier above), and at a new chunk the patch
         * buffer its chunk - 2 used */
        if (s + STAGES - 1 < nsteps) LOAD_STEP(s + STAGES - 1)
        CP_COMMIT();
    }

    const int g = lane >> 2, t4 = lane & 3;
#if POOL
    /* every lane runs every shuffle (uniform control flow); the tests decide only the stores */
    const int OH = H / 2, OW = W / 2;
    const size_t pimg = (size_t)b * OH * OW;
#pragma unroll
    for (int q = 0; q < POOL_PAIRS; ++q)
#pragma unroll
        for (int h = 0; h < POOL_HALVES; ++h) {
#if TW == 8
            const int mt = q, mb = q, et = 0, eb = 2;    /* rows g and g + 8 of one fragment */
#else
            const int mt = (q / ROWF) * 2 * ROWF + q % ROWF, mb = mt + ROWF, et = 2 * h, eb = 2 * h;
#endif
            const int r = wm * WTM + mt * 16 + g + 8 * h;  /* the window's upper-left pixel when g is even */
            const int oy = (y0 + r / TW) >> 1, ox = (x0 + r % TW) >> 1;
            const int ok = (g & 1) == 0 && oy < OH && ox < OW;
            const size_t p = pimg + (size_t)oy * OW + ox;
#pragma unroll
            for (int nj = 0; nj < NJ; ++nj) {
                const int n = n0 + wn * WTN + nj * 8 + 2 * t4;
                float2 v = fmax((float2)(acc[mt][nj][et], acc[mt][nj][et + 1]),
                                (float2)(acc[mb][nj][eb], acc[mb][nj][eb + 1]));
                v = fmax(v, NEIGHBOUR(v));
                if (ok && n < Cstore) {
                    v += (float2)(bias[n], bias[n + 1]);
#if RELU
                    v = fmax(v, (float2)(0.0f));
#endif
                    STORE2(out, p * Cstore + n, v);
                }
            }
        }
#else
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = wm * WTM + mi * 16 + g + 8 * h;
            const int y = y0 + r / TW, x = x0 + r % TW;
            if (y >= H || x >= W) continue;
            const size_t p = img + (size_t)y * W + x;
#pragma unroll
            for (int nj = 0; nj < NJ; ++nj) {
                const int n = n0 + wn * WTN + nj * 8 + 2 * t4;
                if (n >= Cstore) continue;
                float2 v = (float2)(acc[mi][nj][2 * h], acc[mi][nj][2 * h + 1]) + (float2)(bias[n], bias[n + 1]);
#if RELU
                v = fmax(v, (float2)(0.0f));
#endif
                STORE2(out, p * Cstore + n, v);
            }
        }
#endif
}
