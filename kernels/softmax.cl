/* softmax.cl -- row-wise softmax of the logits: prob[b, j] = exp(z[b, j] - max_b) / sum_j exp(z[b, j] - max_b).
 *
 * Layout: z and prob are NB x NCLS, row-major. One work-group of SOFTMAX_WG work-items per row: each work-item
 * strides over the row, then a tree reduction in local memory gives the row maximum and the sum.
 */

#ifndef SOFTMAX_WG
#define SOFTMAX_WG 256  /* work-group size, a power of two, e.g. 64, 128, 256 */
#endif

__kernel __attribute__((reqd_work_group_size(SOFTMAX_WG, 1, 1)))
void softmax(__global const float *restrict z, __global float *restrict prob, const int NCLS)
{
    const int row = get_group_id(0), lid = get_local_id(0);
    __global const float *zr = z + (size_t)row * NCLS;
    __global float *pr = prob + (size_t)row * NCLS;
    __local float red[SOFTMAX_WG];

    float mx = -INFINITY;
    for (int j = lid; j < NCLS; j += SOFTMAX_WG) mx = fmax(mx, zr[j]);
    red[lid] = mx;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = SOFTMAX_WG / 2; s > 0; s >>= 1) {
        if (lid < s) red[lid] = fmax(red[lid], red[lid + s]);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    mx = red[0];
    barrier(CLK_LOCAL_MEM_FENCE);

    float sum = 0.0f;
    for (int j = lid; j < NCLS; j += SOFTMAX_WG) sum += exp(zr[j] - mx);
    red[lid] = sum;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = SOFTMAX_WG / 2; s > 0; s >>= 1) {
        if (lid < s) red[lid] += red[lid + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float inv = 1.0f / red[0];
    for (int j = lid; j < NCLS; j += SOFTMAX_WG) pr[j] = exp(zr[j] - mx) * inv;
}
