/* nhwc.cl -- the tensor-core family's layout kernels: model input to NHWC storage, and 2x2 max pooling in NHWC.
 *
 * Storage as conv_tc.cl: FP16 (TF32 = 0, half bits in ushort), FP32 rounded to TF32 (TF32 = 1), e4m3 codes (FP8 = 1,
 * uchar) or u8 codes (INT8 = 1, uchar). A pixel holds Cpad channels, Cpad a multiple of VEC = 16 bytes / element
 * size; channels past the real ones are zero.
 *
 *   to_nhwc:      x[b, c, y, x] (float NCHW, C real channels)  ->  out[((b*H + y)*W + x)*Cpad + c]
 *                 (FP8: the code of x * scale_inv, scale_inv = 1 / s_in, the first layer's input scale; e4m3.clh;
 *                 INT8: rint(x * scale_inv) saturated to 0 .. 255, for inputs >= 0: the engine's first
 *                 convolution stays FP16 and reads FP16, since the normalised image is signed)
 *   maxpool_nhwc: in[((b*H + y)*W + x)*Cpad + c]               ->  out[((b*OH + oy)*OW + ox)*Cpad + c],
 *                 the max over y = 2oy + dy, x = 2ox + dx (OH = H/2, OW = W/2, floor), VEC channels per work-item
 *                 (FP8, INT8: an unsigned byte max, exact for u8 codes and for the e4m3 codes of values >= 0,
 *                 which order as their bytes: the pooled activations follow a ReLU, whose FP8 store never writes -0;
 *                 tc_epilogue.clh)
 * One work-item per output element (to_nhwc) or VEC-channel chunk (maxpool_nhwc); the host rounds the global
 * size up to the work-group size (NHWC_WG) and the kernels skip indices past the end.
 */

#ifndef TF32
#define TF32 0
#endif
#ifndef FP8
#define FP8 0
#endif
#ifndef INT8
#define INT8 0
#endif
#ifndef NHWC_WG
#define NHWC_WG 256  /* work-group size, e.g. 64, 128, 256 */
#endif
/* cvt.rna.tf32.f32's rounding, in integer arithmetic: to 10 mantissa bits, ties away from zero */
inline float to_tf32(float x) { return as_float((as_uint(x) + 0x1000u) & 0xffffe000u); }

#if TF32
typedef float elem_t;
#define STORE(p, i, v) ((p)[i] = to_tf32(v))
#elif FP8
#include "e4m3.clh"
typedef uchar elem_t;
#define STORE(p, i, v) ((p)[i] = (uchar)e4m3_encode((v) * scale_inv))
#elif INT8
typedef uchar elem_t;
#define STORE(p, i, v) ((p)[i] = convert_uchar_sat_rte((v) * scale_inv))
#else
typedef ushort elem_t;
#define STORE(p, i, v) vstore_half_rte((v), (i), (__global half *)(p))
#endif

__kernel __attribute__((reqd_work_group_size(NHWC_WG, 1, 1)))
void to_nhwc(__global const float *restrict x, __global elem_t *restrict out, const int N, const int C,
             const int H, const int W, const int Cpad
#if FP8 || INT8
             , const float scale_inv
#endif
             )
{
    const int idx = get_global_id(0);
    if (idx >= N * H * W * Cpad) return;
    const int c = idx % Cpad, p = idx / Cpad;
    const int b = p / (H * W), yx = p - b * (H * W);
    STORE(out, idx, c < C ? x[((size_t)b * C + c) * H * W + yx] : 0.0f);
}

#if TF32
#define VEC 4
typedef float4 vec_t;
#define VMAX(a, b) fmax((a), (b))
#elif FP8 || INT8  /* unsigned byte max */
#define VEC 16
typedef uchar16 vec_t;
#define VMAX(a, b) max((a), (b))
#else
#define VEC 8
typedef ushort8 vec_t;
/* max of two FP16 octets, through float (exact: every half is a float) */
inline ushort8 vmax_half8(ushort8 a, ushort8 b) {
    float8 fa = vload_half8(0, (const half *)&a), fb = vload_half8(0, (const half *)&b);
    ushort8 r;
    vstore_half8_rte(fmax(fa, fb), 0, (half *)&r);
    return r;
}
#define VMAX(a, b) vmax_half8((a), (b))
#endif

__kernel __attribute__((reqd_work_group_size(NHWC_WG, 1, 1)))
void maxpool_nhwc(__global const elem_t *restrict in, __global elem_t *restrict out, const int N, const int H,
                  const int W, const int Cpad)
{
    const int OH = H / 2, OW = W / 2, CV = Cpad / VEC;
    const int idx = get_global_id(0);
    if (idx >= N * OH * OW * CV) return;
    const int cv = idx % CV, p = idx / CV;
    const int ox = p % OW, oy = (p / OW) % OH, b = p / (OW * OH);
    __global const vec_t *src = (__global const vec_t *)in;
    const size_t r0 = (((size_t)b * H + 2 * oy) * W + 2 * ox) * CV + cv, r1 = r0 + (size_t)W * CV;
    const vec_t m = VMAX(VMAX(src[r0], src[r0 + CV]), VMAX(src[r1], src[r1 + CV]));
    ((__global vec_t *)out)[idx] = m;
}
