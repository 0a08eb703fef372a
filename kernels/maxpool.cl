/* maxpool.cl -- 2x2 max pooling, stride 2, NCHW (VGG16's only pooling).
 *
 *   out[b, c, oy, ox] = max(in[b, c, 2oy + dy, 2ox + dx]),  dy, dx in {0, 1};  OH = H / 2, OW = W / 2 (floor)
 *   flat index: out[(bc * OH + oy) * OW + ox], in[(bc * H + y) * W + x], bc = b * C + c
 * One work-item per output element; the host rounds the global size up to the work-group size (POOL_WG) and the
 * kernel skips indices past the end.
 */

#ifndef POOL_WG
#define POOL_WG 256  /* work-group size, e.g. 64, 128, 256 */
#endif

#include "storage.clh"  /* in_t, out_t: FP32 or FP16 storage (IN_HALF, OUT_HALF) */

__kernel __attribute__((reqd_work_group_size(POOL_WG, 1, 1)))
void maxpool2x2(__global const in_t *restrict in, __global out_t *restrict out,
                const int BC, const int H, const int W)
{
    const int OH = H / 2, OW = W / 2;
    const int idx = get_global_id(0);
    if (idx >= BC * OH * OW) return;
    const int ox = idx % OW;
    const int oy = (idx / OW) % OH;
    const int bc = idx / (OW * OH);
    const size_t r = ((size_t)bc * H + 2 * oy) * W + 2 * ox;
    ST_OUT(out, idx, fmax(fmax(LD_IN(in, r), LD_IN(in, r + 1)), fmax(LD_IN(in, r + W), LD_IN(in, r + W + 1))));
}
