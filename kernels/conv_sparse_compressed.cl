/* conv_sparse_compressed.cl -- 3x3 convolution (padding 1) + bias + ReLU over pruned weights in a compact format,
 * skipping zero input activations.
 *
 * Format ("tap masks"; host side: vggserve/ops/sparse_conv.py, `tap_mask_stream`). Per output-channel group g of
 * SP_OCG channels, one stream of 32-bit words: for each input tap k = (ci, ky, kx) at which at least one channel of
 * the group has a non-zero weight, in order of k = (ci * 3 + ky) * 3 + kx,
 *     header word   ci << 20 | ky << 18 | kx << 16 | mask     (mask bit j: channel g * SP_OCG + j has a weight at k)
 *     popcount(mask) words: those weights (float32 bits), in order of j
 *  31          20 19 18 17 16 15            0
 * +--------------+-----+-----+---------------+
 * |      ci      | ky  | kx  |     mask      |  ci < 4096, SP_OCG <= 16
 * +--------------+-----+-----+---------------+
 * One load of the input tap serves every non-zero of the group at that tap (as in the generated kernel); bytes
 * per non-zero are 4 plus 4 per tap, with no per-weight index. The streams of all groups are concatenated and cut
 * into chunks of at most SP_CHUNK words at tap boundaries: chunk c spans words [cptr[c], cptr[c+1]), group g
 * owns chunks [gchunk[g], gchunk[g+1]).
 *
 * Where the weights are read from (SP_MEM):
 *   0  global memory (every work-item of a work-group reads the same word: a broadcast, cached);
 *   1  local memory: the work-group copies each chunk in, then reads it from there;
 *   2  constant memory (the host picks it only when the whole stream fits the device's constant buffer).
 * Zero activations (SP_SKIP_ZERO = 1): a tap whose SP_PX input values are all zero (ReLU outputs) skips its FMAs.
 * A zero weight adds v * 0 = +0 to its sum where SP_BRANCHLESS = 1, which leaves every sum unchanged.
 * Work decomposition, accumulators, summation order and store: conv_sparse.clh; input: pad.cl's padded copy.
 */

#include "conv_sparse.clh"

#ifndef SP_MEM
#define SP_MEM 0        /* 0: weights read from global memory, 1: staged through local memory, 2: constant memory */
#endif
#ifndef SP_CHUNK
#define SP_CHUNK 1024   /* words per local-memory chunk (SP_MEM 1; the host cuts the streams to this size) */
#endif
#ifndef SP_SKIP_ZERO
#define SP_SKIP_ZERO 1  /* 1: skip the FMAs of a tap whose input values are all zero */
#endif
#ifndef SP_BRANCHLESS
#define SP_BRANCHLESS 0 /* 1: an FMA for every channel of the group (weight 0 where its mask bit is clear) instead of a
                           branch per channel: CPUs mispredict the random mask bits; GPUs branch uniformly */
#endif

#if SP_MEM == 2
#define SP_WORDS __constant const uint *restrict
#else
#define SP_WORDS __global const uint *restrict
#endif

__kernel __attribute__((reqd_work_group_size(SP_WG, 1, 1)))
void conv_sparse_compressed(__global const float *restrict xp,    /* padded NCHW input (pad.cl) */
                            SP_WORDS words,                       /* the tap-mask streams of all groups */
                            __global const int *restrict cptr,    /* chunk c: words [cptr[c], cptr[c+1]) */
                            __global const int *restrict gchunk,  /* group g: chunks [gchunk[g], gchunk[g+1]) */
                            __global const float *restrict bias,  /* M */
                            __global float *restrict out,         /* NCHW output, B x M x H x W */
                            const int C, const int H, const int W, const int M, const int PW, const int nstrips)
{
    SP_SETUP
    const int g = get_group_id(1);
#if SP_MEM == 1
    __local uint staged[SP_CHUNK];
#endif
    for (int c = gchunk[g]; c < gchunk[g + 1]; ++c) {
        const int w0 = cptr[c], nw = cptr[c + 1] - w0;
#if SP_MEM == 1
        barrier(CLK_LOCAL_MEM_FENCE);  /* everyone is done with the previous chunk */
        for (int i = get_local_id(0); i < nw; i += SP_WG) staged[i] = words[w0 + i];
        barrier(CLK_LOCAL_MEM_FENCE);
        __local const uint *wp = staged;
#else
        SP_WORDS wp = words + w0;
#endif
        for (int i = 0; i < nw;) {
            const uint head = wp[i++];
            const vec v = LD(head >> 20, (head >> 18) & 3u, (head >> 16) & 3u);
#if SP_SKIP_ZERO
            if (VALL_ZERO(v)) {
                i += popcount(head & 0xffffu);
                continue;
            }
#endif
            for (int j = 0; j < SP_OCG; ++j) {
#if SP_BRANCHLESS
                const uint bit = (head >> j) & 1u;
                const float w = as_float(wp[i - 1 + bit]);  /* bit clear: a word already read, not past the chunk */
                acc[j] = fma(v, (vec)(bit ? w : 0.0f), acc[j]);
                i += bit;
#else
                if (head & (1u << j)) acc[j] = fma(v, (vec)(as_float(wp[i++])), acc[j]);
#endif
            }
        }
    }
    SP_STORE(g)
}
