/* jpeg_huffman.cl -- the entropy decoding of baseline JPEG scans, one work-item per independent segment (a restart
 * interval, or the whole scan of a file without restart markers), bit for bit as libjpeg-turbo's jdhuff.c.
 *
 *   data:   the files' bytes back to back (the host uploads them whole; only scan bytes are read)
 *   meta:   int32: the tables below, each at its offset (seg_at, img_at, comp_at, tab_at)
 *   seg:    int32, JH_SEG ints per segment
 *           s[0] image   s[1] first byte   s[2] end byte (the restart marker that ends it, or the file's end)
 *           s[3] first MCU   s[4] MCUs   s[5] 1 for the scan's last segment (EOI must follow), else 0
 *   img:    int32, JH_IMG ints per image: i[0] MCUs per row   i[1] components (1 or 3)   i[2] first component
 *           record (index into comp)
 *   comp:   int32, JH_COMP ints per component: c[0] first block of its coefficient plane   c[1] blocks per plane
 *           row   c[2] h   c[3] v (blocks per MCU = h x v)   c[4] DC table   c[5] AC table
 *   tab:    int32, JH_TAB ints per Huffman table (vggserve/decoding/device/tables.py):
 *           [0, 512)    lookahead: code of <= 9 bits, indexed by the next 9 bits -> (length << 8) | symbol, else 0
 *           [512, 530)  maxcode[l], the largest code of length l (-1: none); maxcode[17] a sentinel
 *           [530, 547)  valoffset[l]: symbol index = valoffset[l] + code, for a code of length l
 *           [547, 803)  the symbols
 *   coef:   int16, 64 per block in natural (row-major) order: block (r, c) of a plane at (first + r * W + c) * 64
 *   settled: int32 per segment: nonzero where jpeg_entropy.cl has decoded it (this kernel then skips it)
 *   status: int32 per segment: 0 clean, else why the segment is not libjpeg's clean decode (JH_* below); the host
 *           then sends the file to the CPU path, which gives Pillow's pixels or error whatever the reason
 *
 * The bit reader is libjpeg's: 0xFF 0x00 is a data byte 0xFF; 0xFF followed by fill bytes 0xFF then 0x00 too;
 * 0xFF followed by anything else is a marker, where data ends and zero bits are fed. A clean segment uses no fed
 * bit, leaves fewer than 8 unused data bits (the padding) and ends right at its marker (a restart marker, or EOI
 * for the last). Work is bounded by the segment's MCUs whatever the bytes say.
 */

#include "jpeg_scan.clh"


typedef struct {
    ulong buf;    /* left-aligned bits */
    int nbits;    /* valid bits in buf (data or fed zeros) */
    int pos;      /* next byte to read */
    int end;      /* first byte not to read */
    long real;    /* data bits loaded so far */
    long used;    /* bits consumed so far */
    int stopped;  /* a marker (or the end) was reached: zeros are fed from now on */
} jh_reader;

inline void jh_fill(jh_reader *r, __global const uchar *data)
{
    while (r->nbits <= 56) {
        uint byte = 0;
        if (!r->stopped) {
            if (r->pos >= r->end) {
                r->stopped = 1;
            } else {
                byte = data[r->pos];
                if (byte == 0xFF) {
                    int p = r->pos + 1;
                    while (p < r->end && data[p] == 0xFF) ++p;
                    if (p < r->end && data[p] == 0x00) {
                        r->pos = p + 1;
                    } else {
                        r->stopped = 1;  /* a marker at r->pos */
                        byte = 0;
                    }
                } else {
                    r->pos += 1;
                }
                if (!r->stopped) r->real += 8;
            }
        }
        r->buf |= (ulong)byte << (56 - r->nbits);
        r->nbits += 8;
    }
}

inline uint jh_peek(const jh_reader *r, const int n) { return (uint)(r->buf >> (64 - n)); }

inline void jh_skip(jh_reader *r, const int n)
{
    r->buf <<= n;
    r->nbits -= n;
    r->used += n;
}

inline int jh_bits(jh_reader *r, const int n)
{
    if (n == 0) return 0;
    const int v = (int)jh_peek(r, n);
    jh_skip(r, n);
    return v;
}

/* libjpeg's HUFF_EXTEND: an n-bit value with a leading 0 is negative */
inline int jh_extend(const int v, const int n) { return (n && v < (1 << (n - 1))) ? v - (1 << n) + 1 : v; }

/* one symbol with table t; -1 for a code the table does not have. Needs >= 16 bits in the buffer. */
inline int jh_symbol(jh_reader *r, __global const int *t)
{
    const int e = t[jh_peek(r, JH_LOOK)];
    if (e) {
        jh_skip(r, e >> 8);
        return e & 255;
    }
    int l = JH_LOOK + 1;
    int code = (int)jh_peek(r, l);
    while (l <= 16 && code > t[512 + l]) {
        ++l;
        code = (int)jh_peek(r, l);
    }
    if (l > 16) return -1;
    jh_skip(r, l);
    return t[547 + t[530 + l] + code] & 255;
}

__kernel void jpeg_huffman(__global const uchar *data, __global const int *meta, const int seg_at, const int img_at,
                           const int comp_at, const int tab_at, __global short *coef, __global int *status,
                           const int nseg, __global const int *settled)
{
    const int g = get_global_id(0);
    if (g >= nseg || settled[g]) return;  /* a segment jpeg_entropy.cl decoded in parallel */
    __global const int *seg = meta + seg_at, *img = meta + img_at, *comp = meta + comp_at, *tab = meta + tab_at;
    __global const int *s = seg + g * JH_SEG;
    __global const int *im = img + s[0] * JH_IMG;
    const int mcus_x = im[0], ncomp = im[1];
    __global const int *cp = comp + im[2] * JH_COMP;
    jh_reader r;
    r.buf = 0; r.nbits = 0; r.pos = s[1]; r.end = s[2]; r.real = 0; r.used = 0; r.stopped = 0;
    int last_dc[3] = {0, 0, 0};
    int why = JH_OK;
    const int first = s[3], count = s[4];
    for (int m = first; m < first + count && why == JH_OK; ++m) {
        const int mx = m % mcus_x, my = m / mcus_x;
        for (int ci = 0; ci < ncomp && why == JH_OK; ++ci) {
            __global const int *c = cp + ci * JH_COMP;
            const int h = c[2], v = c[3];
            __global const int *dct = tab + c[4] * JH_TAB;
            __global const int *act = tab + c[5] * JH_TAB;
            for (int b = 0; b < h * v && why == JH_OK; ++b) {
                const int row = my * v + b / h, col = mx * h + b % h;
                __global short *blk = coef + ((long)c[0] + (long)row * c[1] + col) * 64;
                for (int k = 0; k < 64; ++k) blk[k] = 0;
                jh_fill(&r, data);
                int sym = jh_symbol(&r, dct);
                if (sym < 0) { why = JH_BAD_CODE; break; }
                int diff = jh_extend(jh_bits(&r, sym), sym);
                last_dc[ci] += diff;
                blk[0] = (short)last_dc[ci];
                for (int k = 1; k < 64; ++k) {
                    jh_fill(&r, data);
                    sym = jh_symbol(&r, act);
                    if (sym < 0) { why = JH_BAD_CODE; break; }
                    const int run = sym >> 4, size = sym & 15;
                    if (size) {
                        k += run;
                        const int val = jh_extend(jh_bits(&r, size), size);
                        if (k > 63) { why = JH_BAD_INDEX; break; }
                        blk[jpeg_natural[k]] = (short)val;
                    } else {
                        if (run != 15) break;  /* end of block */
                        k += 15;               /* sixteen zeros */
                    }
                }
            }
        }
    }
    if (why == JH_OK && r.used > r.real) why = JH_PAST_DATA;
    if (why == JH_OK) {
        /* clean end: only padding left (< 8 data bits), the reader at the segment's marker */
        jh_fill(&r, data);
        const int at_marker = (r.real - r.used) < 8 && r.stopped;
        if (!at_marker) {
            why = JH_TRAILING;
        } else if (s[5]) {
            if (!(r.pos + 1 < s[2] && data[r.pos] == 0xFF && data[r.pos + 1] == 0xD9)) why = JH_TRAILING;
        } else if (r.pos != s[2]) {
            why = JH_TRAILING;
        }
    }
    status[g] = why;
}
