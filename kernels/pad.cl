/* pad.cl -- zero-padded copy of NCHW activations, the input of the sparse 3x3 convolutions (conv_sparse_*.cl).
 *
 *   out[(bc * PH + py) * PW + px] = in[(bc * H + py - 1) * W + px - 1]  where 1 <= py <= H and 1 <= px <= W,
 *                                 = 0                                    elsewhere (the border and the right tail)
 *   bc = b * C + c,  PH = H + 2,  PW >= W + 2 (the host rounds W up to a multiple of the convolution's SP_PX and
 *   adds 2, so a work-item's SP_PX + 2 wide row window never leaves its row).
 *
 *        px: 0   1 ..... W   W+1 .. PW-1
 *   py 0     0   0 ..... 0   0 ...... 0
 *      1     0   in[0, 0..W-1]   0 ...... 0
 *      ..
 *      H     0   in[H-1, ...]    0 ...... 0
 *      H+1   0   0 ..... 0   0 ...... 0
 * With the padding in memory, the convolutions read a pixel's 3x3 neighbourhood at fixed offsets, with no bounds
 * checks in their inner loops. One work-item per padded element: x along dimension 0 (coalesced), rows
 * (bc * PH + py) along dimension 1; the host rounds dimension 0 up to PAD_WG and the kernel skips the excess.
 */

#ifndef PAD_WG
#define PAD_WG 64  /* work-group size along x, e.g. 16 (CPU), 64, 128 */
#endif

__kernel __attribute__((reqd_work_group_size(PAD_WG, 1, 1)))
void pad_nchw(__global const float *restrict in, __global float *restrict out,
              const int H, const int W, const int PH, const int PW)
{
    const int px = get_global_id(0);
    if (px >= PW) return;
    const size_t row = get_global_id(1);  /* bc * PH + py */
    const int py = (int)(row % PH);
    const size_t bc = row / PH;
    const int y = py - 1, x = px - 1;
    out[row * PW + px] = (y >= 0 && y < H && x >= 0 && x < W) ? in[(bc * H + y) * W + x] : 0.0f;
}
