/* pixels.cl -- decoded images to model input, on the device: uint8 RGB crops -> normalised float32 NCHW.
 *
 *   px:  N x H x W x 3 uint8, channels R, G, B (what the centre crop produces)   px[((b * H + y) * W + x) * 3 + s]
 *   lut: 3 x 256 float32, lut[c * 256 + v] = the model input of output channel c for source byte v
 *   out: N x 3 x H x W float32                                                   out[((b * 3 + c) * H + y) * W + x]
 *   output channel c reads source channel c (RGB models) or 2 - c (BGR models, SWAP_RB = 1)
 *
 * The host fills the table with its own normalisation applied to every byte value, so the device result is the
 * host's arithmetic bit for bit whatever the mode (torchvision: (v / 255 - mean) / std; caffe: v - mean, BGR).
 * One work-item per pixel; the host rounds the global size up to PX_WG and the kernel skips indices past the end.
 */

#ifndef PX_WG
#define PX_WG 256  /* work-group size, e.g. 64, 128, 256 */
#endif
#ifndef SWAP_RB
#define SWAP_RB 0  /* 1: output channel c reads source channel 2 - c */
#endif

__kernel __attribute__((reqd_work_group_size(PX_WG, 1, 1)))
void pixels_to_input(__global const uchar *restrict px, __global const float *restrict lut,
                     __global float *restrict out, const int N, const int HW)
{
    const int idx = get_global_id(0);
    if (idx >= N * HW) return;
    const int b = idx / HW, p = idx - b * HW;
    __global const uchar *s = px + (size_t)idx * 3;
    __global float *o = out + (size_t)b * 3 * HW + p;
    for (int c = 0; c < 3; ++c) {
        const int src = SWAP_RB ? 2 - c : c;
        o[(size_t)c * HW] = lut[c * 256 + s[src]];
    }
}
