/* conv_winograd.cl -- 3x3 convolution (stride 1, zero padding 1) + bias + ReLU by Winograd F(m x m, 3x3),
 * m = WINO_M: 2 (F(2x2,3x3), the default: 4x4 input tiles, 16 GEMMs) or 4 (F(4x4,3x3): 6x6 input tiles, 36 GEMMs).
 *
 * Three kernels, enqueued in this order on one in-order queue (host side: vggserve/model/winograd.py):
 *   wino_input   V = B^T d B   per (input channel c, tile p)                      in  -> V
 *   wino_gemm    Mw[xi] = U[xi]^T V[xi], NXI independent GEMMs (U stored C x M)    V   -> Mw
 *   wino_output  Y = A^T M A + bias, ReLU, m x m outputs per tile                 Mw  -> out
 * with a = m + 2 (WA, the tile side of the transformed domain) and NXI = a*a points (16 or 36).
 *
 * Tiles. An H x W image is covered by TH x TW tiles of m x m outputs, TH = ceil(H/m), TW = ceil(W/m),
 * T = TH*TW per image. One launch handles a chunk of nb images starting at image b0; its tiles are numbered
 *   p = b * T + ty * TW + tx,   0 <= p < P = nb * T,   b = p / T, ty = (p % T) / TW, tx = p % TW.
 * Tile p reads the a x a input patch d[i][j] = in[b0+b, c, m*ty-1+i, m*tx-1+j] (0 outside the image: padding 1,
 * and the bottom/right tail when m does not divide H or W) and writes out[b0+b, k, m*ty+dy, m*tx+dx] for dy, dx
 * in [0, m) where m*ty+dy < H and m*tx+dx < W (outputs beyond H/W are computed and dropped).
 *
 * Transforms (correlation, as in deep learning; xi = a*i + j indexes the a*a points of the transformed domain;
 * U = G g G^T per (output channel, c) is computed once at load, V = B^T d B, Y = A^T (sum_c U .* V) A).
 * F(2x2, 3x3), points 0, 1, -1, inf:
 *        | 1  0 -1  0 |          | 1    0    0  |
 *  B^T = | 0  1  1  0 |     G =  | 1/2  1/2  1/2|      A^T = | 1  1  1  0 |
 *        | 0 -1  1  0 |          | 1/2 -1/2  1/2|            | 0  1 -1 -1 |
 *        | 0  1  0 -1 |          | 0    0    1  |
 * F(4x4, 3x3) (Lavin & Gray 2015), points 0, 1, -1, 2, -2, inf:
 *        | 4  0 -5  0  1  0 |        |  1/4    0     0  |
 *        | 0 -4 -4  1  1  0 |        | -1/6  -1/6  -1/6 |          | 1  1  1  1  1  0 |
 *  B^T = | 0  4 -4 -1  1  0 |   G =  | -1/6   1/6  -1/6 |   A^T =  | 0  1 -1  2 -2  0 |
 *        | 0 -2 -1  2  1  0 |        |  1/24  1/12  1/6 |          | 0  1  1  4  4  0 |
 *        | 0  2 -1 -2  1  0 |        |  1/24 -1/12  1/6 |          | 0  1 -1  8 -8  1 |
 *        | 0  4  0 -5  0  1 |        |  0     0     1   |
 * (U: on the host in float64, or by relayout.cl's winograd_weights / winograd4_weights in float32.)
 *
 * Layouts (all float32, row-major; C = input channels, M = output channels):
 *   in  NCHW       in[((b * C + c) * H + y) * W + x]
 *   U   NXI x Cpad x Mpad  U[(xi * Cpad + c) * Mpad + m]  Cpad = C rounded up to TK, Mpad = M rounded up to TM,
 *                  zero padded, so the GEMM's A loads need no checks (same as conv_gemm.cl's wt, one per xi)
 *   V   NXI x C x P        V[(xi * C + c) * P + p]         dense, P of the current chunk
 *   Mw  NXI x M x P        Mw[(xi * M + m) * P + p]        dense
 *   out NCHW       out[((b * M + m) * H + y) * W + x]
 * Offsets into V, Mw and the images are computed in size_t (NXI * C * P exceeds 2^31 at large batches).
 *
 * wino_gemm is conv_gemm.cl's scheme on a plain matrix B (the same for both m): for xi = get_group_id(2),
 *   Mw[xi][m, p] = sum_c U[xi][c, m] * V[xi][c, p]      (GEMM: M rows, P columns, depth C)
 * one work-group computes a TM x TP tile of Mw[xi], walking C in TK-deep slices held in local memory,
 * double buffered (slice t+1 fetched into registers while slice t is multiplied). Work-item (tx, ty) of the
 * (TN/WN) x (TM/WM) work-group holds a WM x WN register block: rows m0 + ty + i*(TM/WM), columns
 * n0 + tx + j*(TN/WN). Element e = tid + l * NT of a slice is row e / TM (A) or e / TN (B), column e % TM or
 * e % TN, so consecutive work-items load consecutive addresses. B loads are checked (c < C, p < P; zero
 * otherwise) and stores are checked (m < M, p < P); the host launches whole work-groups only.
 * wino_input and wino_output are one work-item per (tile, channel), XWG work-items along the tiles, so their
 * NXI stores (input) and NXI loads (output) are coalesced along p. With WINO_M 4 and W a multiple of 4,
 * wino_output stores each row of 4 outputs as one float4 (aligned: H*W, the row start m*ty*W and m*tx are
 * multiples of 4 floats, and buffers start aligned), so a work-group's stores are contiguous; with W even
 * (e.g. 14) as two float2 (8-byte aligned likewise; a pair is wholly inside or outside the image).
 */

#ifndef WINO_M
#define WINO_M 2  /* outputs per tile side: 2 = F(2x2,3x3), 4 = F(4x4,3x3) */
#endif
#ifndef TM
#define TM 64   /* GEMM tile in M (output channels) per work-group, e.g. 32, 64, 128 */
#endif
#ifndef TN
#define TN 64   /* GEMM tile in N (output tiles) per work-group, e.g. 32, 64, 128 */
#endif
#ifndef TK
#define TK 16   /* depth of one C slice held in local memory, e.g. 8, 16, 32 */
#endif
#ifndef WM
#define WM 4    /* GEMM outputs per work-item in M (register blocking), e.g. 2, 4, 8, 16 */
#endif
#ifndef WN
#define WN 4    /* GEMM outputs per work-item in N (register blocking), e.g. 2, 4, 8 */
#endif
#ifndef LPAD
#define LPAD 1  /* extra floats per local-memory row, against bank conflicts (0 or 1) */
#endif
#ifndef XWG
#define XWG 64  /* work-group size of wino_input and wino_output (along the tiles), e.g. 16, 64, 256 */
#endif
#ifndef RELU
#define RELU 1  /* fuse max(0, .) into wino_output's store */
#endif

#if WINO_M == 2
#define WA 4
#elif WINO_M == 4
#define WA 6
#else
#error "conv_winograd.cl: WINO_M must be 2 or 4"
#endif
#define NXI (WA * WA)           /* points of the transformed domain = number of GEMMs */

#include "gemm_loop.clh"  /* LM, LN, NT, A_LOADS (U), B_LOADS (V); the tile, K loop, A loads both GEMMs share */

#if (TM % WM) || (TN % WN) || ((TK * TM) % NT) || ((TK * TN) % NT)
#error "conv_winograd.cl: need TM % WM == 0, TN % WN == 0, and TK*TM, TK*TN multiples of (TM/WM)*(TN/WN)"
#endif

#if WINO_M == 4
/* y = B^T x on 6 points (F(4x4,3x3)); 12 adds, 6 multiplies by 2 or 4 (exact) */
#define WINO_BT6(x0, x1, x2, x3, x4, x5, y0, y1, y2, y3, y4, y5)                           \
    {                                                                                  \
        const float s42 = (x4) - (x2), s13 = (x1) - (x3);                              \
        y0 = 4.0f * ((x0) - (x2)) + s42;                                               \
        y1 = ((x3) + (x4)) - 4.0f * ((x1) + (x2));                                     \
        y2 = 4.0f * ((x1) - (x2)) + ((x4) - (x3));                                     \
        y3 = s42 - 2.0f * s13;                                                         \
        y4 = s42 + 2.0f * s13;                                                         \
        y5 = 4.0f * s13 + ((x5) - (x3));                                               \
    }
/* y = A^T x on 6 points -> 4 outputs (F(4x4,3x3)) */
#define WINO_AT6(x0, x1, x2, x3, x4, x5, y0, y1, y2, y3)                                   \
    {                                                                                  \
        const float a = (x1) + (x2), b = (x1) - (x2), c = (x3) + (x4), e = (x3) - (x4);   \
        y0 = (x0) + a + c;                                                             \
        y1 = b + 2.0f * e;                                                             \
        y2 = a + 4.0f * c;                                                             \
        y3 = b + 8.0f * e + (x5);                                                      \
    }
#endif

__kernel __attribute__((reqd_work_group_size(XWG, 1, 1)))
void wino_input(__global const float *restrict in,  /* NCHW input */
                __global float *restrict V,         /* NXI x C x P */
                const int C, const int H, const int W, const int TW, const int T, const int P, const int b0)
{
    const int p = get_global_id(0);
    const int c = get_global_id(1);
    if (p >= P) return;
    const int b = p / T, r = p - (p / T) * T;
    const int ty = r / TW, tx = r - (r / TW) * TW;
    const int y0 = WINO_M * ty - 1, x0 = WINO_M * tx - 1;
    __global const float *src = in + ((size_t)(b0 + b) * C + c) * (size_t)H * W;

    float d[WA][WA];
    for (int i = 0; i < WA; ++i) {
        const int iy = y0 + i;
        for (int j = 0; j < WA; ++j) {
            const int ix = x0 + j;
            d[i][j] = (iy >= 0 && iy < H && ix >= 0 && ix < W) ? src[iy * W + ix] : 0.0f;
        }
    }
    const size_t plane = (size_t)C * P;  /* distance between consecutive xi */
    __global float *dst = V + (size_t)c * P + p;
    float t[WA][WA];  /* t = B^T d */
#if WINO_M == 2
    for (int j = 0; j < 4; ++j) {
        t[0][j] = d[0][j] - d[2][j];
        t[1][j] = d[1][j] + d[2][j];
        t[2][j] = d[2][j] - d[1][j];
        t[3][j] = d[1][j] - d[3][j];
    }
    for (int i = 0; i < 4; ++i) {      /* V = t B, row i */
        dst[(4 * i + 0) * plane] = t[i][0] - t[i][2];
        dst[(4 * i + 1) * plane] = t[i][1] + t[i][2];
        dst[(4 * i + 2) * plane] = t[i][2] - t[i][1];
        dst[(4 * i + 3) * plane] = t[i][1] - t[i][3];
    }
#else
    for (int j = 0; j < 6; ++j)
        WINO_BT6(d[0][j], d[1][j], d[2][j], d[3][j], d[4][j], d[5][j],
                 t[0][j], t[1][j], t[2][j], t[3][j], t[4][j], t[5][j])
    for (int i = 0; i < 6; ++i) {      /* V = t B, row i */
        float v0, v1, v2, v3, v4, v5;
        WINO_BT6(t[i][0], t[i][1], t[i][2], t[i][3], t[i][4], t[i][5], v0, v1, v2, v3, v4, v5)
        dst[(6 * i + 0) * plane] = v0;
        dst[(6 * i + 1) * plane] = v1;
        dst[(6 * i + 2) * plane] = v2;
        dst[(6 * i + 3) * plane] = v3;
        dst[(6 * i + 4) * plane] = v4;
        dst[(6 * i + 5) * plane] = v5;
    }
#endif
}

__kernel __attribute__((reqd_work_group_size(LN, LM, 1)))
void wino_gemm(__global const float *restrict U,  /* NXI x Cpad x Mpad */
               __global const float *restrict V,  /* NXI x C x P */
               __global float *restrict Mw,       /* NXI x M x P */
               const int C, const int Cpad, const int M, const int Mpad, const int P)
{
    const int xi = get_group_id(2);
    __global const float *A = U + (size_t)xi * Cpad * Mpad;
    __global const float *B = V + (size_t)xi * C * P;
    __global float *Y = Mw + (size_t)xi * M * P;

    GEMM_TILE()
    GEMM_REGS()
    const int ntiles = Cpad / TK;

#define U_AT(i) A[i]
#define WFETCH(k0)                                                                       \
    GEMM_FETCH_A(U_AT, k0)                                                               \
    for (int l = 0; l < B_LOADS; ++l) {                                                  \
        const int e = tid + l * NT;                                                      \
        const int k = (k0) + e / TN, q = n0 + e % TN;                                    \
        rb[l] = (k < C && q < P) ? B[(size_t)k * P + q] : 0.0f;                          \
    }

#define WSTASH(buf)                                                                      \
    GEMM_STASH_A(buf)                                                                    \
    for (int l = 0; l < B_LOADS; ++l) {                                                  \
        const int e = tid + l * NT;                                                      \
        Bs[buf][e / TN][e % TN] = rb[l];                                                 \
    }

    GEMM_K_LOOP(WFETCH, WSTASH, 0)

#define Y_AT(m, q) Y[(size_t)(m) * P + (q)]
    GEMM_STORE_RAW(P, Y_AT)
}

__kernel __attribute__((reqd_work_group_size(XWG, 1, 1)))
void wino_output(__global const float *restrict Mw,    /* NXI x M x P */
                 __global const float *restrict bias,  /* M */
                 __global float *restrict out,         /* NCHW output */
                 const int M, const int H, const int W, const int TW, const int T, const int P, const int b0)
{
    const int p = get_global_id(0);
    const int m = get_global_id(1);
    if (p >= P) return;
    const int b = p / T, r = p - (p / T) * T;
    const int ty = r / TW, tx = r - (r / TW) * TW;

    const size_t plane = (size_t)M * P;
    __global const float *src = Mw + (size_t)m * P + p;
    const float bm = bias[m];
    float y[WINO_M][WINO_M];  /* (A^T M) A + bias */
#if WINO_M == 2
    float s0[4], s1[4];  /* A^T M, rows 0 and 1 */
    for (int j = 0; j < 4; ++j) {
        const float v0 = src[(0 + j) * plane], v1 = src[(4 + j) * plane];
        const float v2 = src[(8 + j) * plane], v3 = src[(12 + j) * plane];
        s0[j] = v0 + v1 + v2;
        s1[j] = v1 - v2 - v3;
    }
    y[0][0] = s0[0] + s0[1] + s0[2] + bm;
    y[0][1] = s0[1] - s0[2] - s0[3] + bm;
    y[1][0] = s1[0] + s1[1] + s1[2] + bm;
    y[1][1] = s1[1] - s1[2] - s1[3] + bm;
#else
    float s[4][6];  /* A^T M */
    for (int j = 0; j < 6; ++j)
        WINO_AT6(src[(0 + j) * plane], src[(6 + j) * plane], src[(12 + j) * plane], src[(18 + j) * plane],
                 src[(24 + j) * plane], src[(30 + j) * plane], s[0][j], s[1][j], s[2][j], s[3][j])
    for (int i = 0; i < 4; ++i) {
        WINO_AT6(s[i][0], s[i][1], s[i][2], s[i][3], s[i][4], s[i][5], y[i][0], y[i][1], y[i][2], y[i][3])
        for (int j = 0; j < 4; ++j) y[i][j] += bm;
    }
#endif

    const int oy = WINO_M * ty, ox = WINO_M * tx;
    __global float *dst = out + ((size_t)(b0 + b) * M + m) * (size_t)H * W + oy * W + ox;
#if WINO_M == 4
    if ((W & 3) == 0) {  /* every row of 4 outputs lies inside the image and is 16-byte aligned: one float4 store */
        for (int dy = 0; dy < 4; ++dy) {
            if (oy + dy >= H) break;
            float4 v = (float4)(y[dy][0], y[dy][1], y[dy][2], y[dy][3]);
#if RELU
            v = fmax(v, (float4)(0.0f));
#endif
            *(__global float4 *)(dst + dy * W) = v;
        }
        return;
    }
    if ((W & 1) == 0) {  /* W even (14, 6, ...): pairs of outputs are 8-byte aligned and wholly in or out */
        for (int dy = 0; dy < 4; ++dy) {
            if (oy + dy >= H) break;
            for (int dx = 0; dx < 4; dx += 2) {
                if (ox + dx >= W) break;
                float2 v = (float2)(y[dy][dx], y[dy][dx + 1]);
#if RELU
                v = fmax(v, (float2)(0.0f));
#endif
                *(__global float2 *)(dst + dy * W + dx) = v;
            }
        }
        return;
    }
#endif
    for (int dy = 0; dy < WINO_M; ++dy) {
        if (oy + dy >= H) break;
        for (int dx = 0; dx < WINO_M; ++dx) {
            if (ox + dx >= W) break;
            float v = y[dy][dx];
#if RELU
            v = fmax(v, 0.0f);
#endif
            dst[dy * W + dx] = v;
        }
    }
}
