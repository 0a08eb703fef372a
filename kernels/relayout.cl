/* relayout.cl -- weights from the file's layout to the GEMM's A layout, on the device, once at load.
 *
 *   in:  W, M rows of K floats, row-major        W[m * K + k]     (torchvision: cout x (cin * 3 * 3), fc: out x in)
 *   out: A, Kpad rows of Mpad values, k-major    A[k * Mpad + m] = W[m * K + k] for m < M and k < K, else 0
 *        (float, or half with OUT_HALF = 1)
 *
 * A tiled transpose: a work-group of RL_TILE x RL_ROWS work-items moves one RL_TILE x RL_TILE tile through local
 * memory (one column of padding, so the transposed reads hit distinct banks); each work-item moves
 * RL_TILE / RL_ROWS elements. The host launches whole work-groups over the padded output (Mpad x Kpad rounded up
 * to RL_TILE); every read and write is bounds-checked, so no work-group is partial.
 */

#include "storage.clh"  /* out_t: the transposed weights' storage (OUT_HALF); Winograd weights stay float */

#ifndef RL_TILE
#define RL_TILE 32  /* tile side, e.g. 16, 32 */
#endif
#ifndef RL_ROWS
#define RL_ROWS 8   /* work-items per tile column; RL_TILE must be a multiple of it */
#endif

__kernel __attribute__((reqd_work_group_size(RL_TILE, RL_ROWS, 1)))
void transpose_pad(__global const float *restrict W, __global out_t *restrict A,
                   const int M, const int K, const int Mpad, const int Kpad)
{
    __local float tile[RL_TILE][RL_TILE + 1];
    const int tx = get_local_id(0), ty = get_local_id(1);
    const int m0 = get_group_id(1) * RL_TILE, k0 = get_group_id(0) * RL_TILE;

    for (int r = ty; r < RL_TILE; r += RL_ROWS) {  /* read rows m of W, coalesced along k */
        const int m = m0 + r, k = k0 + tx;
        tile[r][tx] = (m < M && k < K) ? W[(size_t)m * K + k] : 0.0f;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int r = ty; r < RL_TILE; r += RL_ROWS) {  /* write rows k of A, coalesced along m */
        const int k = k0 + r, m = m0 + tx;
        if (k < Kpad && m < Mpad) ST_OUT(A, (size_t)k * Mpad + m, tile[tx][r]);
    }
}

/* Winograd F(2x2,3x3) weights for conv_winograd.cl, one work-item per (m, c):
 *
 *   in:  g, M x C x 3 x 3 (torchvision's layout)            g[((m * C + c) * 3 + k) * 3 + l]
 *   out: U, 16 x Cpad x Mpad, zero-padded                    U[((4i + j) * Cpad + c) * Mpad + m] = (G g[m, c] G^T)[i, j]
 *   G = [1 0 0; 1/2 1/2 1/2; 1/2 -1/2 1/2; 0 0 1]
 *
 * Work-items past M or C write the padding's zeros; the host launches whole work-groups of RL_WG over Mpad
 * (rounded up) by Cpad, and work-items past Mpad return.
 */
#ifndef RL_WG
#define RL_WG 64  /* work-group size along m */
#endif

__kernel __attribute__((reqd_work_group_size(RL_WG, 1, 1)))
void winograd_weights(__global const float *restrict g, __global float *restrict U,
                      const int M, const int C, const int Mpad, const int Cpad)
{
    const int m = get_global_id(0), c = get_global_id(1);
    if (m >= Mpad || c >= Cpad) return;
    float u[16];
    for (int i = 0; i < 16; ++i) u[i] = 0.0f;
    if (m < M && c < C) {
        __global const float *w = g + ((size_t)m * C + c) * 9;
        float t[4][3];  /* G g */
        for (int l = 0; l < 3; ++l) {
            const float a = w[l], b = w[3 + l], d = w[6 + l];
            t[0][l] = a;
            t[1][l] = 0.5f * (a + b + d);
            t[2][l] = 0.5f * (a - b + d);
            t[3][l] = d;
        }
        for (int i = 0; i < 4; ++i) {  /* (G g) G^T */
            u[4 * i + 0] = t[i][0];
            u[4 * i + 1] = 0.5f * (t[i][0] + t[i][1] + t[i][2]);
            u[4 * i + 2] = 0.5f * (t[i][0] - t[i][1] + t[i][2]);
            u[4 * i + 3] = t[i][2];
        }
    }
    for (int xi = 0; xi < 16; ++xi) U[((size_t)xi * Cpad + c) * Mpad + m] = u[xi];
}

/* Winograd F(4x4,3x3) weights for conv_winograd.cl built with WINO_M 4, one work-item per (m, c):
 *
 *   in:  g, M x C x 3 x 3                                     g[((m * C + c) * 3 + k) * 3 + l]
 *   out: U, 36 x Cpad x Mpad, zero-padded                     U[((6i + j) * Cpad + c) * Mpad + m] = (G g[m, c] G^T)[i, j]
 *   G = [1/4 0 0; -1/6 -1/6 -1/6; -1/6 1/6 -1/6; 1/24 1/12 1/6; 1/24 -1/12 1/6; 0 0 1]
 *
 * Same launch as winograd_weights (whole work-groups of RL_WG over Mpad rounded up, by Cpad).
 */
__kernel __attribute__((reqd_work_group_size(RL_WG, 1, 1)))
void winograd4_weights(__global const float *restrict g, __global float *restrict U,
                       const int M, const int C, const int Mpad, const int Cpad)
{
    const int m = get_global_id(0), c = get_global_id(1);
    if (m >= Mpad || c >= Cpad) return;
    float u[36];
    for (int i = 0; i < 36; ++i) u[i] = 0.0f;
    if (m < M && c < C) {
        __global const float *w = g + ((size_t)m * C + c) * 9;
        float t[6][3];  /* G g */
        for (int l = 0; l < 3; ++l) {
            const float a = w[l], b = w[3 + l], d = w[6 + l];
            t[0][l] = a * (1.0f / 4);
            t[1][l] = (a + b + d) * (-1.0f / 6);
            t[2][l] = (a - b + d) * (-1.0f / 6);
            t[3][l] = a * (1.0f / 24) + b * (1.0f / 12) + d * (1.0f / 6);
            t[4][l] = a * (1.0f / 24) - b * (1.0f / 12) + d * (1.0f / 6);
            t[5][l] = d;
        }
        for (int i = 0; i < 6; ++i) {  /* (G g) G^T */
            const float a = t[i][0], b = t[i][1], d = t[i][2];
            u[6 * i + 0] = a * (1.0f / 4);
            u[6 * i + 1] = (a + b + d) * (-1.0f / 6);
            u[6 * i + 2] = (a - b + d) * (-1.0f / 6);
            u[6 * i + 3] = a * (1.0f / 24) + b * (1.0f / 12) + d * (1.0f / 6);
            u[6 * i + 4] = a * (1.0f / 24) - b * (1.0f / 12) + d * (1.0f / 6);
            u[6 * i + 5] = d;
        }
    }
    for (int xi = 0; xi < 36; ++xi) U[((size_t)xi * Cpad + c) * Mpad + m] = u[xi];
}
