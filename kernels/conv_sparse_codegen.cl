/* conv_sparse_codegen.cl -- 3x3 convolution (padding 1) + bias + ReLU with the pruned weights compiled into the code.
 *
 * The template of a generated program (host side: vggserve/ops/sparse_codegen.py). The host writes, for one
 * layer's weights (M, C, 3, 3), one `case g:` block per output-channel group of SP_OCG channels, and this file
 * includes it where `#include "conv_sparse_weights.gen"` stands. A block lists the group's input taps with at
 * least one non-zero weight, in order of k = (ci * 3 + ky) * 3 + kx, each tap followed by its non-zero weights as
 * immediate constants (float literals that round-trip the float32 value exactly):
 *
 *     case 3: {
 *     G(17)                                    if (gate > 17) {
 *     L(0,0,1) A(0,0.0724f) A(5,-0.0151f)      v = LD(0, 0, 1); acc[0] += v * 0.0724f; acc[5] += v * -0.0151f
 *     L(0,1,0) A(2,0.113f)
 *     ...
 *     E                                        }
 *     G(18) ...                                (every 32 taps: see codegen_cases)
 *     } break;
 *
 * Zero weights have no instruction at all, and there are no index arrays: the positions are in the code. The
 * weights are read as instruction operands (GPUs: immediates or the constant cache). The cost moves to program
 * size and build time, both roughly proportional to the non-zero count (docs/sparse.md has the figures and the
 * layer sizes where this kernel is built). Programs are cached like any other, keyed by a hash of the weights.
 * Input: pad.cl's padded copy; work decomposition, accumulators and store: conv_sparse.clh.
 */

#include "conv_sparse.clh"

#define L(ci, ky, kx) v = LD(ci, ky, kx);
#define A(j, w) a##j = fma(v, (vec)(w), a##j);
#define G(i) if (gate > (i)) {  /* always taken (gate = INT_MAX): only cuts the code into basic blocks */
#define E }

/* one named accumulator per group channel, a0 .. a{SP_OCG-1} (not an array: LLVM's alias analysis of a large
 * array in a huge function is itself superlinear); FOR_ACC(X) applies X to the indices */
#if SP_OCG > 32
#error "conv_sparse_codegen.cl takes SP_OCG <= 32"
#endif
#if SP_OCG > 0
#define A0(X) X(0)
#else
#define A0(X)
#endif
#if SP_OCG > 1
#define A1(X) X(1)
#else
#define A1(X)
#endif
#if SP_OCG > 2
#define A2(X) X(2)
#else
#define A2(X)
#endif
#if SP_OCG > 3
#define A3(X) X(3)
#else
#define A3(X)
#endif
#if SP_OCG > 4
#define A4(X) X(4)
#else
#define A4(X)
#endif
#if SP_OCG > 5
#define A5(X) X(5)
#else
#define A5(X)
#endif
#if SP_OCG > 6
#define A6(X) X(6)
#else
#define A6(X)
#endif
#if SP_OCG > 7
#define A7(X) X(7)
#else
#define A7(X)
#endif
#if SP_OCG > 8
#define A8(X) X(8)
#else
#define A8(X)
#endif
#if SP_OCG > 9
#define A9(X) X(9)
#else
#define A9(X)
#endif
#if SP_OCG > 10
#define A10(X) X(10)
#else
#define A10(X)
#endif
#if SP_OCG > 11
#define A11(X) X(11)
#else
#define A11(X)
#endif
#if SP_OCG > 12
#define A12(X) X(12)
#else
#define A12(X)
#endif
#if SP_OCG > 13
#define A13(X) X(13)
#else
#define A13(X)
#endif
#if SP_OCG > 14
#define A14(X) X(14)
#else
#define A14(X)
#endif
#if SP_OCG > 15
#define A15(X) X(15)
#else
#define A15(X)
#endif
#if SP_OCG > 16
#define A16(X) X(16)
#else
#define A16(X)
#endif
#if SP_OCG > 17
#define A17(X) X(17)
#else
#define A17(X)
#endif
#if SP_OCG > 18
#define A18(X) X(18)
#else
#define A18(X)
#endif
#if SP_OCG > 19
#define A19(X) X(19)
#else
#define A19(X)
#endif
#if SP_OCG > 20
#define A20(X) X(20)
#else
#define A20(X)
#endif
#if SP_OCG > 21
#define A21(X) X(21)
#else
#define A21(X)
#endif
#if SP_OCG > 22
#define A22(X) X(22)
#else
#define A22(X)
#endif
#if SP_OCG > 23
#define A23(X) X(23)
#else
#define A23(X)
#endif
#if SP_OCG > 24
#define A24(X) X(24)
#else
#define A24(X)
#endif
#if SP_OCG > 25
#define A25(X) X(25)
#else
#define A25(X)
#endif
#if SP_OCG > 26
#define A26(X) X(26)
#else
#define A26(X)
#endif
#if SP_OCG > 27
#define A27(X) X(27)
#else
#define A27(X)
#endif
#if SP_OCG > 28
#define A28(X) X(28)
#else
#define A28(X)
#endif
#if SP_OCG > 29
#define A29(X) X(29)
#else
#define A29(X)
#endif
#if SP_OCG > 30
#define A30(X) X(30)
#else
#define A30(X)
#endif
#if SP_OCG > 31
#define A31(X) X(31)
#else
#define A31(X)
#endif
#define FOR_ACC(X) A0(X) A1(X) A2(X) A3(X) A4(X) A5(X) A6(X) A7(X) A8(X) A9(X) A10(X) A11(X) A12(X) A13(X) \
    A14(X) A15(X) A16(X) A17(X) A18(X) A19(X) A20(X) A21(X) A22(X) A23(X) A24(X) A25(X) A26(X) A27(X) A28(X) \
    A29(X) A30(X) A31(X)
#define ACC_DECL(j) vec a##j = (vec)(0.0f);
#define ACC_SAVE(j) acc[j] = a##j;

__kernel __attribute__((reqd_work_group_size(SP_WG, 1, 1)))
void conv_sparse_codegen(__global const float *restrict xp,    /* padded NCHW input (pad.cl) */
                         __global const float *restrict bias,  /* M */
                         __global float *restrict out,         /* NCHW output, B x M x H x W */
                         const int C, const int H, const int W, const int M, const int PW, const int nstrips,
                         const int gate)
{
    SP_SETUP
    const int g = get_group_id(1);
    vec v;
    FOR_ACC(ACC_DECL)
    switch (g) {
#include "conv_sparse_weights.gen"
    default: break;
    }
    FOR_ACC(ACC_SAVE)
    SP_STORE(g)
}
