/* conv_winograd.cl -- 3x3 convolution (stride 1, zero padding 1) + bias + ReLU by Winograd F(2x2, 3x3).
 *
 * Three kernels, enqueued in this order on one in-order queue (host side: vggserve/model/winograd.py):
 *   wino_input   V = B^T d B   per (input channel c, tile p)                    in  -> V
 *   wino_gemm    Mw[xi] = U[xi]^T V[xi], 16 independent GEMMs (U stored C x M)    V   -> Mw
 *   wino_output  Y = A^T M A + bias, ReLU, 2x2 outputs per tile                 Mw  -> out
 *
 * Tiles. An H x W image is covered by TH x TW tiles of 2x2 outputs, TH = (H+1)/2, TW = (W+1)/2, T = TH*TW per
 * image. One launch handles a chunk of nb images starting at image b0; its tiles are numbered
 *   p = b * T + ty * TW + tx,   0 <= p < P = nb * T,   b = p / T, ty = (p % T) / TW, tx = p % TW.
 * Tile p reads the 4x4 input patch d[i][j] = in[b0+b, c, 2ty-1+i, 2tx-1+j] (0 outside the image: padding 1,
 * and the bottom/right tail of odd H or W) and writes out[b0+b, m, 2ty+dy, 2tx+dx] for dy, dx in {0, 1} where
 * 2ty+dy < H and 2tx+dx < W (outputs beyond H/W are computed and dropped).
 *
 * Transforms (correlation, as in deep learning; xi = 4*i + j indexes the 16 points of the 4x4 domain):
 *        | 1  0 -1  0 |          | 1    0    0  |
 *  B^T = | 0  1  1  0 |     G =  | 1/2  1/2  1/2|      A^T = | 1  1  1  0 |
 *        | 0 -1  1  0 |          | 1/2 -1/2  1/2|            | 0  1 -1 -1 |
 *        | 0  1  0 -1 |          | 0    0    1  |
 *   U = G g G^T (4x4 per (m, c); done once on the host in float64),  V = B^T d B,  Y = A^T (U .* V summed) A.
 *
 * Layouts (all float32, row-major; C = input channels, M = output channels):
 *   in  NCHW       in[((b * C + c) * H + y) * W + x]
 *   U   16 x Cpad x Mpad   U[(xi * Cpad + c) * Mpad + m]   Cpad = C rounded up to TK, Mpad = M rounded up to TM,
 *                  zero padded, so the GEMM's A loads need no checks (same as conv_gemm.cl's wt, one per xi)
 *   V   16 x C x P         V[(xi * C + c) * P + p]          dense, P of the current chunk
 *   Mw  16 x M x P         Mw[(xi * M + m) * P + p]         dense
 *   out NCHW       out[((b * M + m) * H + y) * W + x]
 * Offsets into V, Mw and the images are computed in size_t (16 * C * P exceeds 2^31 at large batches).
 *
 * wino_gemm is conv_gemm.cl's scheme on a plain matrix B: for xi = get_group_id(2),
 *   Mw[xi][m, p] = sum_c U[xi][c, m] * V[xi][c, p]      (GEMM: M rows, P columns, depth C)
 * one work-group computes a TM x TP tile of Mw[xi], walking C in TK-deep slices held in local memory,
 * double buffered (slice t+1 fetched into registers while slice t is multiplied). Work-item (tx, ty) of the
 * (TN/WN) x (TM/WM) work-group holds a WM x WN register block: rows m0 + ty + i*(TM/WM), columns
 * n0 + tx + j*(TN/WN). Element e = tid + l * NT of a slice is row e / TM (A) or e / TN (B), column e % TM or
 * e % TN, so consecutive work-items load consecutive addresses. B loads are checked (c < C, p < P; zero
 * otherwise) and stores are checked (m < M, p < P); the host launches whole work-groups only.
 * wino_input and wino_output are one work-item per (tile, channel), XWG work-items along the tiles.
 */

#ifndef TM
#define TM 64   /* GEMM tile in M (output channels) per work-group, e.g. 32, 64, 128 */
#endif
#ifndef TN
#define TN 64   /* GEMM tile in N (2x2-output tiles) per work-group, e.g. 32, 64, 128 */
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

#define LM (TM / WM)            /* GEMM work-group size in M */
#define LN (TN / WN)            /* GEMM work-group size in N */
#define NT (LM * LN)            /* GEMM work-items per work-group */
#define A_LOADS (TK * TM / NT)  /* elements of A (U) each work-item fetches per slice */
#define B_LOADS (TK * TN / NT)  /* elements of B (V) each work-item fetches per slice */

#if (TM % WM) || (TN % WN) || ((TK * TM) % NT) || ((TK * TN) % NT)
#error "conv_winograd.cl: need TM % WM == 0, TN % WN == 0, and TK*TM, TK*TN multiples of (TM/WM)*(TN/WN)"
#endif

__kernel __attribute__((reqd_work_group_size(XWG, 1, 1)))
void wino_input(__global const float *restrict in,  /* NCHW input */
                __global float *restrict V,         /* 16 x C x P */
                const int C, const int H, const int W, const int TW, const int T, const int P, const int b0)
{
    const int p = get_global_id(0);
    const int c = get_global_id(1);
    if (p >= P) return;
    const int b = p / T, r = p - (p / T) * T;
    const int ty = r / TW, tx = r - (r / TW) * TW;
    const int y0 = 2 * ty - 1, x0 = 2 * tx - 1;
    __global const float *src = in + ((size_t)(b0 + b) * C + c) * (size_t)H * W;

    float d[4][4];
    for (int i = 0; i < 4; ++i) {
        const int iy = y0 + i;
        for (int j = 0; j < 4; ++j) {
            const int ix = x0 + j;
            d[i][j] = (iy >= 0 && iy < H && ix >= 0 && ix < W) ? src[iy * W + ix] : 0.0f;
        }
    }
    float t[4][4];  /* t = B^T d */
    for (int j = 0; j < 4; ++j) {
        t[0][j] = d[0][j] - d[2][j];
        t[1][j] = d[1][j] + d[2][j];
        t[2][j] = d[2][j] - d[1][j];
        t[3][j] = d[1][j] - d[3][j];
    }
    const size_t plane = (size_t)C * P;  /* distance between consecutive xi */
    __global float *dst = V + (size_t)c * P + p;
    for (int i = 0; i < 4; ++i) {      /* V = t B, row i */
        dst[(4 * i + 0) * plane] = t[i][0] - t[i][2];
        dst[(4 * i + 1) * plane] = t[i][1] + t[i][2];
        dst[(4 * i + 2) * plane] = t[i][2] - t[i][1];
        dst[(4 * i + 3) * plane] = t[i][1] - t[i][3];
    }
}

__kernel __attribute__((reqd_work_group_size(LN, LM, 1)))
void wino_gemm(__global const float *restrict U,  /* 16 x Cpad x Mpad */
               __global const float *restrict V,  /* 16 x C x P */
               __global float *restrict Mw,       /* 16 x M x P */
               const int C, const int Cpad, const int M, const int Mpad, const int P)
{
    const int xi = get_group_id(2);
    __global const float *A = U + (size_t)xi * Cpad * Mpad;
    __global const float *B = V + (size_t)xi * C * P;
    __global float *Y = Mw + (size_t)xi * M * P;

    const int tx = get_local_id(0), ty = get_local_id(1);
    const int tid = ty * LN + tx;
    const int m0 = get_group_id(1) * TM;
    const int n0 = get_group_id(0) * TN;

    __local float As[2][TK][TM + LPAD];
    __local float Bs[2][TK][TN + LPAD];

    float ra[A_LOADS], rb[B_LOADS];
    float acc[WM][WN];
    for (int i = 0; i < WM; ++i)
        for (int j = 0; j < WN; ++j) acc[i][j] = 0.0f;

    const int ntiles = Cpad / TK;

#define WFETCH(k0)                                                                       \
    for (int l = 0; l < A_LOADS; ++l) {                                                  \
        const int e = tid + l * NT;                                                      \
        ra[l] = A[(size_t)((k0) + e / TM) * Mpad + m0 + e % TM];                         \
    }                                                                                    \
    for (int l = 0; l < B_LOADS; ++l) {                                                  \
        const int e = tid + l * NT;                                                      \
        const int k = (k0) + e / TN, q = n0 + e % TN;                                    \
        rb[l] = (k < C && q < P) ? B[(size_t)k * P + q] : 0.0f;                          \
    }

#define WSTASH(buf)                                                                      \
    for (int l = 0; l < A_LOADS; ++l) {                                                  \
        const int e = tid + l * NT;                                                      \
        As[buf][e / TM][e % TM] = ra[l];                                                 \
    }                                                                                    \
    for (int l = 0; l < B_LOADS; ++l) {                                                  \
        const int e = tid + l * NT;                                                      \
        Bs[buf][e / TN][e % TN] = rb[l];                                                 \
    }

    WFETCH(0)
    WSTASH(0)
    barrier(CLK_LOCAL_MEM_FENCE);

    for (int t = 0; t < ntiles; ++t) {
        const int cur = t & 1;
        if (t + 1 < ntiles) { WFETCH((t + 1) * TK) }
        for (int kk = 0; kk < TK; ++kk) {
            float a[WM], b[WN];
            for (int i = 0; i < WM; ++i) a[i] = As[cur][kk][ty + i * LM];
            for (int j = 0; j < WN; ++j) b[j] = Bs[cur][kk][tx + j * LN];
            for (int i = 0; i < WM; ++i)
                for (int j = 0; j < WN; ++j) acc[i][j] = fma(a[i], b[j], acc[i][j]);
        }
        if (t + 1 < ntiles) { WSTASH(cur ^ 1) }
        barrier(CLK_LOCAL_MEM_FENCE);
    }

    for (int j = 0; j < WN; ++j) {
        const int q = n0 + tx + j * LN;
        if (q >= P) continue;
        for (int i = 0; i < WM; ++i) {
            const int m = m0 + ty + i * LM;
            if (m < M) Y[(size_t)m * P + q] = acc[i][j];
        }
    }
}

__kernel __attribute__((reqd_work_group_size(XWG, 1, 1)))
void wino_output(__global const float *restrict Mw,    /* 16 x M x P */
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
    float s0[4], s1[4];  /* A^T M, rows 0 and 1 */
    for (int j = 0; j < 4; ++j) {
        const float v0 = src[(0 + j) * plane], v1 = src[(4 + j) * plane];
        const float v2 = src[(8 + j) * plane], v3 = src[(12 + j) * plane];
        s0[j] = v0 + v1 + v2;
        s1[j] = v1 - v2 - v3;
    }
    const float bm = bias[m];
    float y[2][2];  /* (A^T M) A + bias */
    y[0][0] = s0[0] + s0[1] + s0[2] + bm;
    y[0][1] = s0[1] - s0[2] - s0[3] + bm;
    y[1][0] = s1[0] + s1[1] + s1[2] + bm;
    y[1][1] = s1[1] - s1[2] - s1[3] + bm;

    const int oy = 2 * ty, ox = 2 * tx;
    __global float *dst = out + ((size_t)(b0 + b) * M + m) * (size_t)H * W + oy * W + ox;
    for (int dy = 0; dy < 2; ++dy) {
        if (oy + dy >= H) break;
        for (int dx = 0; dx < 2; ++dx) {
            if (ox + dx >= W) break;
            float v = y[dy][dx];
#if RELU
            v = fmax(v, 0.0f);
#endif
            dst[dy * W + dx] = v;
        }
    }
}
