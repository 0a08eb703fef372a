/* conv_sparse_compressed.cl -- 3x3 convolution (padding 1) + bias + ReLU over pruned weights in a compact format,
 * skipping zero input activations.
 *
 * Format ("tap masks"; host side: vggserve/ops/sparse_formats.py, `tap_masks`). Per output-channel group g of
 * SP_OCG channels, for each input tap k = (ci, ky, kx) at which at least one channel of the group has a non-zero
 * weight, in order of k = (ci * 3 + ky) * 3 + kx, one 32-bit header
 *  31          20 19 18 17 16 15            0
 * +--------------+-----+-----+---------------+
 * |      ci      | ky  | kx  |     mask      |  mask bit j: channel g * SP_OCG + j has a weight at k
 * +--------------+-----+-----+---------------+  ci < 4096, SP_OCG <= 16
 * and, in a separate array, those popcount(mask) weights in order of j. One load of the input tap serves every
 * non-zero of the group at that tap (as in the generated kernel); bytes per non-zero are 4, plus 4 per tap, with no
 * per-weight index. Headers and values are apart so that the next header's address never waits for this one's
 * contents (the value index is a running sum of popcounts, kept in a register). All groups are concatenated and
 * cut into chunks of whole taps of at most SP_CHUNK words (headers + values): chunk c has headers
 * [cptr[c], cptr[c+1]) and values [vptr[c], vptr[c+1]); group g owns chunks [gchunk[g], gchunk[g+1]). The value
 * array ends with one 0, so a branch-free read one past a chunk's values stays in bounds.
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
#define SP_CHUNK 1024   /* headers + values per local-memory chunk (SP_MEM 1; the host cuts the chunks to it) */
#endif
#ifndef SP_SKIP_ZERO
#define SP_SKIP_ZERO 1  /* 1: skip the FMAs of a tap whose input values are all zero */
#endif
#ifndef SP_BRANCHLESS
#define SP_BRANCHLESS 0 /* 1: an FMA for every channel of the group (weight 0 where its mask bit is clear) instead of a
                           branch per channel: CPUs mispredict the random mask bits; GPUs branch uniformly */
#endif

#if SP_MEM == 2
#define SP_MEMSPACE __constant
#else
#define SP_MEMSPACE __global
#endif

__kernel __attribute__((reqd_work_group_size(SP_WG, 1, 1)))
void conv_sparse_compressed(__global const float *restrict xp,    /* padded NCHW input (pad.cl) */
                            SP_MEMSPACE const uint *restrict heads,  /* tap headers of all groups */
                            SP_MEMSPACE const float *restrict vals,  /* their non-zeros, then one 0 */
                            __global const int *restrict cptr,    /* chunk c: heads [cptr[c], cptr[c+1]) */
                            __global const int *restrict vptr,    /* chunk c: vals [vptr[c], vptr[c+1]) */
                            __global const int *restrict gchunk,  /* group g: chunks [gchunk[g], gchunk[g+1]) */
                            __global const float *restrict bias,  /* M */
                            __global float *restrict out,         /* NCHW output, B x M x H x W */
                            const int C, const int H, const int W, const int M, const int PW, const int nstrips)
{
    SP_SETUP
    const int g = get_group_id(1);
#if SP_MEM == 1
    __local uint staged[SP_CHUNK + 1];  /* the chunk's headers, then its values, then a 0 */
#endif
    for (int c = gchunk[g]; c < gchunk[g + 1]; ++c) {
        const int h0 = cptr[c], nh = cptr[c + 1] - h0;
        const int v0 = vptr[c];
#if SP_MEM == 1
        const int nv = vptr[c + 1] - v0;
        barrier(CLK_LOCAL_MEM_FENCE);  /* everyone is done with the previous chunk */
        for (int i = get_local_id(0); i < nh; i += SP_WG) staged[i] = heads[h0 + i];
        for (int i = get_local_id(0); i <= nv; i += SP_WG) staged[nh + i] = i < nv ? as_uint(vals[v0 + i]) : 0u;
        barrier(CLK_LOCAL_MEM_FENCE);
        __local const uint *hp = staged;
        __local const float *vp = (__local const float *)(staged + nh);
#else
        SP_MEMSPACE const uint *hp = heads + h0;
        SP_MEMSPACE const float *vp = vals + v0;
#endif
        int vi = 0;
        for (int i = 0; i < nh; ++i) {
            const uint head = hp[i];
            const vec v = LD(head >> 20, (head >> 18) & 3u, (head >> 16) & 3u);
#if SP_SKIP_ZERO
            if (VALL_ZERO(v)) {
                vi += popcount(head & 0xffffu);
                continue;
            }
#endif
            for (int j = 0; j < SP_OCG; ++j) {
#if SP_BRANCHLESS
                const uint bit = (head >> j) & 1u;
                const float w = vp[vi];  /* bit clear: the next weight (or the final 0), read and not used */
                acc[j] = fma(v, (vec)(bit ? w : 0.0f), acc[j]);
                vi += bit;
#else
                if (head & (1u << j)) acc[j] = fma(v, (vec)(vp[vi++]), acc[j]);
#endif
            }
        }
    }
    SP_STORE(g)
}
