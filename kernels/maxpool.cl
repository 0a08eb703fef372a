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

__kernel __attribute__((reqd_work_group_size(POOL_WG, 1, 1)))
void maxpool2x2(__global const float *restrict in, __global float *restrict out,
                const int BC, const int H, const int W)
{
    const int OH = H / 2, OW = W / 2;
    const int idx = get_global_id(0);
    if (idx >= BC * OH * OW) return;
    const int ox = idx % OW;
    const int oy = (idx / OW) % OH;
    const int bc = idx / (OW * OH);
    __global const float *r = in + ((size_t)bc * H + 2 * oy) * W + 2 * ox;
    out[idx] = fmax(fmax(r[0], r[1]), fmax(r[W], r[W + 1]));
}
