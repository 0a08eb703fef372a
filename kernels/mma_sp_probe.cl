/* mma_sp_probe.cl -- one mma.sp m16n8k32 (FP16 in, FP32 accumulate) by one warp, on registers the host packed:
 * benchmarks/mma_sp_probe.py checks mma.clh's reading of the PTX ISA's fragment and metadata layouts against the
 * hardware (native), or the software model against numpy (MMA_EMULATE = 1).
 *
 *   regs: 32 lanes x 9 uints: a0-a3, b0-b3, the metadata word          regs[lane * 9 + i]
 *   d:    32 lanes x 4 floats, the accumulator fragment as the lane holds it (row g + 8 (q / 2), column
 *         2 (lane % 4) + q % 2 of D for register q; the m16n8 layout of mma.sync)      d[lane * 4 + q]
 * Defines: MMA_EMULATE, SP_SEL (sparsity selector, 0 or 1), SP_ORDERED (1: mma.sp::ordered_metadata).
 */

#ifndef MMA_EMULATE
#define MMA_EMULATE 0
#endif
#define TF32 0
#define OUT_F32 1
#define STAGES 2

#include "mma.clh"

__kernel __attribute__((reqd_work_group_size(32, 1, 1)))
void mma_sp_probe(__global const uint *restrict regs, __global float *restrict d)
{
    const int lane = get_local_id(0);
#if MMA_EMULATE
    __local uint xch_sp[32 * XCH_SP];
#endif
    uint a[4], b[4];
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int i = 0; i < 4; ++i) {
        a[i] = regs[lane * 9 + i];
        b[i] = regs[lane * 9 + 4 + i];
    }
    const uint e = regs[lane * 9 + 8];
    MMA_SP(acc, a, b, e);
    for (int q = 0; q < 4; ++q) d[lane * 4 + q] = acc[q];
}
