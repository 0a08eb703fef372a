/* jpeg_entropy.cl -- the entropy decoding of baseline JPEG scans in parallel within each segment, by
 * self-synchronisation (Weissenberger and Schmidt, "Massively Parallel Huffman Decoding on GPUs", ICPP 2018, and
 * their JPEG follow-up, arXiv 2111.09219): the segment's bytes are cut into chunks of JE_CHUNK bytes, one
 * work-item each. Results are bit for bit jpeg_huffman.cl's (libjpeg's), which decodes what this does not settle.
 *
 * A decoding state is (p, u, k): p the position of the next bit (8 * byte index + bit, never inside a stuffed
 * 0x00), u the block's place in the MCU's sequence of blocks, k the next coefficient (0: the DC). Decoding chunk j
 * means decoding every symbol that starts before the chunk's end, from an entry state; its exit state is the entry
 * of chunk j + 1. The first chunk of a segment knows its entry; the others start from a guess (the chunk's first
 * byte, u = 0, k = 0). Huffman codes resynchronise: a wrong start soon decodes the same symbols as a right one.
 * While synchronising nothing stops a decode: a code no table has counts as an end of block after 16 bits, a run
 * past coefficient 63 ends the block, bits past the data are zeros; jpeg_decode, from exact entries, flags these.
 *
 *   jpeg_sync (run `rounds` times, decoder.py): every chunk decodes from its entry and records the entry it used,
 *       its exit, the blocks it completed and the sum of the DC differences it read per component. In round 0 the
 *       entry is a guess: the state reached by decoding from `lookback` bytes before the chunk (a decode started
 *       anywhere has mostly synchronised by then). From round 1 the entry is the previous round's exit of the
 *       chunk before; a chunk whose entry is the one it used last copies its exit instead of decoding again. Once a
 *       round changes no exit, every entry is the true one (the first is exact and each exit is a function of its
 *       entry); the last round's "changed" flag per segment says whether that happened. Each round from 1 also
 *       raises its flag in `changed` (one int per round) where any chunk's state moved; a round after one that
 *       moved none returns at once (`skip_quiet`), as its work would copy every state: the late rounds of a batch
 *       that settled early then cost a launch each.
 *       A chunk that decodes again from a new entry (`resume`) stops at the first of its checkpoints where it is in
 *       the state its last decode recorded there (same bit, same block of the MCU, a block start): the rest of the
 *       decode would be that one's, so the exit and the later checkpoints are that decode's, their blocks and DC
 *       sums moved by the difference at the checkpoint. A new entry mostly resynchronises within a few symbols,
 *       so most such decodes stop early (a warp still takes as long as its slowest lane).
 *       The rounds read a plain AC symbol's run without its value: several of them at once where the next
 *       JE_MULTI bits hold them whole (jpeg_multi's tables, built on the device per batch). Only the DC values (the
 *       predictors' sums) and the run lengths matter to a chunk's exit, so its exits are those of one symbol at a
 *       time, bit for bit.
 *   jpeg_prefix_groups, _totals, _entry: the first block of each chunk and the DC predictors at its entry, by
 *       prefix sums over the chunks of its segment (all chunks in parallel).
 *   jpeg_decode (per part of a chunk): decodes its part of the chunk again, writing coefficients (DC absolute).
 *       Every decode of a chunk in the rounds records JE_CKPTS checkpoints on its way: its state at the first block
 *       start past each (JE_CKPTS + 1)-th of the chunk, with the blocks and DC sums so far. The last decode started
 *       from the exact entry, so its checkpoints are exact too, and the parts between them are decoded in parallel
 *       (one work-item each: the pass is bound by one work-item's serial latency). The part that completes the
 *       segment's blocks checks libjpeg's clean end; parts after it (the padding and the marker, whose rounds
 *       decoded garbage) do nothing. A segment whose rounds did not settle is left to the serial kernel
 *       (jpeg_huffman.cl, launched after with the same status buffer).
 *
 *   data, meta, coef, status as in jpeg_huffman.cl (seg, img, comp, tab records at their offsets in meta)
 *   chunk:  int32, JE_CHUNK_INTS per chunk: c[0] segment, c[1] first byte, c[2] end byte
 *   seg:    as jpeg_huffman.cl, plus s[6] the segment's first chunk, s[7] its chunks
 *   state:  int32, JE_STATE ints per chunk: exit p, u, k, blocks completed, DC sums (3), valid
 *   used:   int32, JE_USED ints per chunk: the entry (p, u, k, valid) its last decode started from
 *   entry:  int32, JE_ENTRY ints per chunk (jpeg_prefix_entry): first block, DC predictors (3)
 *   ckpt:   int32, JE_CKPTS checkpoints of JE_CK ints per chunk: bit p (-1: the decode ended before it), block u of
 *           the MCU, blocks completed since the chunk's entry, DC sums since it (3); coefficient 0 (a block start)
 *   settled: int32 per segment, 1 before the rounds: the last round sets 0 where it changed an exit
 *   multi:  JE_MULTI_N entries (je_multi_t) per Huffman table (jpeg_multi): entry x says what the JE_MULTI bits x
 *           decode to as AC symbols of that table: bits 0-4 the bits they take whole (0: not even one symbol), 5-10
 *           the coefficients they advance (run + 1 each, 16 for a ZRL; the EOB, if any, not counted; at most 63),
 *           11 whether the last is an EOB, 12-15 the bit where the last symbol starts
 */

#include "jpeg_scan.clh"
#define JE_CHUNK_INTS 4
#define JE_STATE 8
#define JE_ENTRY 4
#define JE_USED 4
#ifndef JE_CKPTS
#define JE_CKPTS 3                  /* checkpoints a chunk's decodes record (its decoding pass: JE_CKPTS + 1 parts) */
#endif
#define JE_CK 6                     /* ints per checkpoint */
#ifndef JE_MULTI
#define JE_MULTI 14                 /* index bits of a multi-symbol table (decoder.py's MULTI_BITS) */
#endif
#define JE_MULTI_N (1 << JE_MULTI)  /* entries per Huffman table */
typedef ushort je_multi_t;          /* an entry */


/* is byte q the start of data (not a marker, not past the end)? */
inline int je_is_data(__global const uchar *d, const int q, const int end)
{
    return q < end && (d[q] != 0xFF || (q + 1 < end && d[q + 1] == 0));
}

/* the symbol whose code starts word w and its length (*l), from table t and its first-level entry e = t[w >> 23]
 * (codes of up to JH_LOOK bits); -1 for a code the table lacks (*l then 17) */
inline int je_code(const uint w, __global const int *t, const int e, int *l)
{
    if (e) {
        *l = e >> 8;
        return e & 255;
    }
    int n = 10;
    while (n <= 16 && (int)(w >> (32 - n)) > t[512 + n]) ++n;
    *l = n;
    return n > 16 ? -1 : t[547 + t[530 + n] + (int)(w >> (32 - n))] & 255;
}

/* the extended value of the s bits (0 to 16) that follow l code bits in word w (0 for s = 0) */
inline int je_value(const uint w, const int l, const int s)
{
    const int sv = max(s, 1);
    const int v = (int)((w << l) >> (32 - sv));
    return s ? ((v < (1 << (sv - 1))) ? v - ((1 << sv) - 1) : v) : 0;
}

/* decode one symbol (and its value bits) from word w with table t: returns the symbol, sets *len to the bits used
 * (code + value) and *val to the extended value; -1 for a code the table lacks */
inline int je_symbol(const uint w, __global const int *t, const int dc, int *len, int *val)
{
    int l;
    const int sym = je_code(w, t, t[w >> 23], &l);
    if (sym < 0) return -1;
    const int s = dc ? sym : (sym & 15);
    *len = l + s;
    *val = je_value(w, l, s);
    return sym;
}

typedef struct {
    __global const int *cp;  /* the image's component records */
    int b1, b2, bpm;         /* blocks of component 0, of components 0 and 1, of the MCU */
    int dc0, dc1, dc2, ac0, ac1, ac2;  /* each component's Huffman tables (indices into tab) */
} je_mcu;

inline void je_mcu_init(je_mcu *m, __global const int *cp, const int ncomp)
{
    m->cp = cp;
    m->b1 = cp[2] * cp[3];
    m->b2 = ncomp > 1 ? m->b1 + cp[JH_COMP + 2] * cp[JH_COMP + 3] : 1 << 20;
    m->bpm = ncomp > 2 ? m->b2 + cp[2 * JH_COMP + 2] * cp[2 * JH_COMP + 3] : (ncomp > 1 ? m->b2 : m->b1);
    m->dc0 = cp[4]; m->ac0 = cp[5];
    m->dc1 = ncomp > 1 ? cp[JH_COMP + 4] : 0; m->ac1 = ncomp > 1 ? cp[JH_COMP + 5] : 0;
    m->dc2 = ncomp > 2 ? cp[2 * JH_COMP + 4] : 0; m->ac2 = ncomp > 2 ? cp[2 * JH_COMP + 5] : 0;
}

/* the big-endian value of 4 bytes, and whether one of them is 0xFF (a marker or a stuffed byte: loaded one by one) */
inline uint je_be4(const uchar4 v) { return as_uint(v.s3210); }
inline int je_has_ff4(const uchar4 v)
{
    const uint x = ~as_uint(v);
    return ((x - 0x01010101U) & ~x & 0x80808080U) != 0;
}

/* je_run's bit buffer: `acc` holds the next `avail` bits of the scan's data, left-aligned, with stuffing removed (the
 * 0x00 after each 0xFF byte dropped) and zeros from the data's end on (a marker, or the segment's end); `sm` marks,
 * at the same bits, the last bit of each 0xFF byte whose 0x00 was dropped, so that consuming it moves the position p
 * one byte further (p never points into a stuffed 0x00). `lpos` is the next byte to load, `pend` the first bit past
 * the data (8 * the first byte that is not data; INT_MAX until a refill meets it): bits consumed past it are what
 * libjpeg calls a premature end. Every symbol is then read from the register, stuffed bytes and the scan's end
 * included, with one path for all. */
typedef struct {
    ulong acc, sm;
    int avail, lpos, pend;
} je_bits;

/* top the buffer up past 56 bits: 4 bytes at once where they hold no 0xFF and lie before the end, else byte by byte
 * (a stuffed pair, a marker, the end) */
inline void je_fill(__global const uchar *d, const int end, je_bits *b)
{
    if (b->avail <= 32 && b->lpos + 4 <= end && b->pend == INT_MAX) {
        const uchar4 v = vload4(0, d + b->lpos);
        if (!je_has_ff4(v)) {
            b->acc |= (ulong)je_be4(v) << (32 - b->avail);
            b->avail += 32;
            b->lpos += 4;
            if (b->avail > 56) return;
        }
    }
    while (b->avail <= 56) {
        const int q = b->lpos;
        uint x = 0;
        if (b->pend == INT_MAX) {
            if (q < end && d[q] != 0xFF) {
                x = d[q];
                b->lpos = q + 1;
            } else if (q + 1 < end && d[q] == 0xFF && d[q + 1] == 0) {
                x = 0xFF;
                b->lpos = q + 2;
                b->sm |= 1UL << (56 - b->avail);
            } else {
                b->pend = 8 * q;
            }
        }
        b->acc |= (ulong)x << (56 - b->avail);
        b->avail += 8;
    }
}

/* the buffer at bit p (never inside a stuffed 0x00) */
inline void je_start(__global const uchar *d, const int end, je_bits *b, const int p)
{
    b->acc = 0; b->sm = 0; b->avail = 0; b->lpos = p >> 3; b->pend = INT_MAX;
    je_fill(d, end, b);
    const int r = p & 7;
    b->acc <<= r; b->sm <<= r; b->avail -= r;
}

/* the position after n (1 to 32) more bits from p, stuffed bytes passed over */
inline int je_after(const je_bits *b, const int p, const int n)
{
    return p + n + 8 * (int)popcount(b->sm >> (64 - n));
}

/* consume n (1 to 32) bits at p; returns the new position */
inline int je_take(je_bits *b, const int p, const int n)
{
    const int q = je_after(b, p, n);
    b->acc <<= n; b->sm <<= n; b->avail -= n;
    return q;
}

/* decode symbols starting before bit `stop_p`, from (p, u, k); with `coef` non-null also write the coefficients of
 * blocks from absolute block `b0`, DC predictors `dcp`, stopping at `total` blocks. Returns 0, or an error code.
 * The bits come from a 64-bit register buffer (je_bits: stuffing removed as it is loaded, zeros past the data),
 * so every symbol takes one path, next to a 0xFF byte and at the scan's end too; each step looks up the single- and
 * the multi-symbol entry side by side and takes one by selects. A warp's lanes each decode their own chunk, and
 * every path one of them takes costs them all: one 32-chunk warp 219 us a round with a byte-wise path near 0xFF
 * bytes, 150 with the buffer, 118 with the selects (H200, entropy_latency). What depends only on the block (its
 * component, tables, DC predictor, coefficients' place) is found once per block. `multi` (synchronising only, coef
 * null; 0: one symbol at a time): the batch's jpeg_multi tables, which take plain AC symbols several at a time from
 * the register buffer. `ck` (synchronising only; 0: none): the chunk's JE_CKPTS checkpoints, each written at the
 * first block start at or past bit ck_from + (c + 1) * ck_step (p, u, the blocks completed and the DC sums so far),
 * -1 where the decode stops before it. `was` (with ck; 0: none): the exit of the chunk's last decode, whose
 * checkpoints ck holds: at a checkpoint where this decode is in that decode's state, it takes that decode's exit and
 * checkpoints, moved by the blocks and DC sums read before. */
inline int je_run(__global const uchar *d, const int end, __global const int *tab, const je_mcu *m,
                  int *pos, int *bit, int *u, int *k, const long stop_p, int *blocks, int *dc0, int *dc1, int *dc2,
                  __global short *coef, const int b0, const int first_mcu, const int mcus_x, const int total,
                  __global const je_multi_t *multi, __global int *ck, const int ck_from, const int ck_step,
                  __global const int *was)
{
    *blocks = 0;
    int p = *pos * 8 + *bit;  /* the next bit, 8 * byte + bit */
    const int stop = (int)min(stop_p, (long)0x7FFFFFFF);
    je_bits bb;
    je_start(d, end, &bb, p);
    int c = 0, fresh = 1;
    __global const int *tdc = tab, *tac = tab;
    __global const je_multi_t *mac = 0;  /* the block's AC table's multi-symbol entries */
    __global short *blk = 0;
    int ci = 0;  /* the next checkpoint */
    while (p < stop) {
        if (coef && b0 + *blocks >= total) break;
        if (ck && *k == 0) {
            while (ci < JE_CKPTS && p >= ck_from + (ci + 1) * ck_step) {
                __global int *w = ck + ci * JE_CK;
                if (was && w[0] == p && w[1] == *u) {
                    /* the chunk's last decode passed this checkpoint in this state: from here on this decode is
                     * that one, so its exit and later checkpoints are that decode's, the blocks and DC sums moved
                     * by what the two decodes read before this point */
                    const int db = *blocks - w[2], e0 = *dc0 - w[3], e1 = *dc1 - w[4], e2 = *dc2 - w[5];
                    for (int i = ci; i < JE_CKPTS; ++i) {
                        __global int *x = ck + i * JE_CK;
                        if (x[0] >= 0) { x[2] += db; x[3] += e0; x[4] += e1; x[5] += e2; }
                    }
                    *pos = was[0] >> 3; *bit = was[0] & 7; *u = was[1]; *k = was[2];
                    *blocks = was[3] + db; *dc0 = was[4] + e0; *dc1 = was[5] + e1; *dc2 = was[6] + e2;
                    return 0;
                }
                w[0] = p; w[1] = *u; w[2] = *blocks; w[3] = *dc0; w[4] = *dc1; w[5] = *dc2;
                ++ci;
            }
        }
        if (*k == 0 || fresh) {  /* a new block (or the first symbol of this call): its component and tables */
            fresh = 0;
            c = (*u >= m->b1) + (*u >= m->b2);
            tdc = tab + (c == 0 ? m->dc0 : (c == 1 ? m->dc1 : m->dc2)) * JH_TAB;
            const int ac = c == 0 ? m->ac0 : (c == 1 ? m->ac1 : m->ac2);
            tac = tab + ac * JH_TAB;
            if (multi) mac = multi + ac * JE_MULTI_N;
            if (coef) {
                __global const int *cr = m->cp + c * JH_COMP;
                const int b = b0 + *blocks;
                const int mcu = first_mcu + b / m->bpm, within = *u - (c == 0 ? 0 : (c == 1 ? m->b1 : m->b2));
                const int h = cr[2];
                const int row = (mcu / mcus_x) * cr[3] + within / h, col = (mcu % mcus_x) * h + within % h;
                blk = coef + ((long)cr[0] + (long)row * cr[1] + col) * 64;
            }
        }
        const int dc = (*k == 0);
        __global const int *t = dc ? tdc : tac;
        if (bb.avail < 32) je_fill(d, end, &bb);
        const uint w = (uint)(bb.acc >> 32);
        const int es = t[w >> 23];  /* the single-symbol entry, looked up beside the multi-symbol one */
        const uint e = (mac && !dc) ? mac[(uint)(bb.acc >> (64 - JE_MULTI))] : 0u;
        const int nb = (int)(e & 31), eob = (int)((e >> 11) & 1), kk = *k + (int)((e >> 5) & 63);
        const int last = (int)((e >> 12) & 15);
        /* plain AC symbols, as many as the next JE_MULTI bits hold, values skipped: every symbol starts before the
         * stop and ends within the data, and none but the last can end the block */
        const int took = nb && kk <= 64 - eob && (last ? je_after(&bb, p, last) : p) < stop &&
                         je_after(&bb, p, nb) <= bb.pend;
        int l = es >> 8, sym = es & 255;
        if (!took && !es) {  /* a code longer than JH_LOOK bits, or none */
            sym = je_code(w, t, es, &l);
            if (sym < 0) {  /* a wrong guess may read any bits: while synchronising, 16 of them end the block */
                if (coef) return JH_BAD_CODE;
                l = 16; sym = 0;
            }
        }
        const int sz = dc ? sym : (sym & 15);
        const int val = je_value(w, l, sz);
        p = je_take(&bb, p, took ? nb : l + sz);
        if (p > bb.pend) {  /* it read past the data */
            if (coef) return JH_PAST_DATA;
            *pos = 0x7FFFFFF;  /* while synchronising: past the data, a state no true one equals; stop here */
            *bit = 0;
            for (; ck && ci < JE_CKPTS; ++ci) ck[ci * JE_CK] = -1;
            return 0;
        }
        const int run = sym >> 4, size = sym & 15;
        const int at = min(*k + run, 63);  /* a run past coefficient 63 ends the block, as libjpeg does */
        const int single = !took && dc;
        *dc0 += (single && c == 0) ? val : 0;
        *dc1 += (single && c == 1) ? val : 0;
        *dc2 += (single && c == 2) ? val : 0;
        if (coef) {
            if (dc) {
                blk[0] = (short)(c == 0 ? *dc0 : (c == 1 ? *dc1 : *dc2));
            } else if (size) {
                if (*k + run > 63) return JH_BAD_INDEX;
                blk[jpeg_natural[at]] = (short)val;
            }
        }
        *k = took ? (eob ? 64 : kk) : (dc ? 1 : (size ? at + 1 : (run == 15 ? *k + 16 : 64)));
        if (*k >= 64) {
            *k = 0;
            *u = (*u + 1 == m->bpm) ? 0 : *u + 1;
            *blocks += 1;
        }
    }
    for (; ck && ci < JE_CKPTS; ++ci) ck[ci * JE_CK] = -1;
    *pos = p >> 3;
    *bit = p & 7;
    return 0;
}

/* one work-item per (table, JE_MULTI-bit pattern): the AC symbols (codes the table has, with their value bits)
 * that lie whole within the pattern, read one by one as je_symbol reads them, up to an EOB; stopped before a run
 * that would take the block past its end */
__kernel void jpeg_multi(__global const int *meta, const int tab_at, const int ntab, __global je_multi_t *multi)
{
    const int g = get_global_id(0);
    if (g >= ntab * JE_MULTI_N) return;
    __global const int *t = meta + tab_at + (g / JE_MULTI_N) * JH_TAB;
    const uint w = (uint)(g % JE_MULTI_N) << (32 - JE_MULTI);
    int at = 0, adv = 0, eob = 0, last = 0;
    while (at < JE_MULTI) {
        int len, val;
        const int sym = je_symbol(w << at, t, 0, &len, &val);
        if (sym < 0 || at + len > JE_MULTI) break;
        const int run = sym >> 4, size = sym & 15;
        const int step = size ? run + 1 : (run == 15 ? 16 : 0);
        if (adv + step > 63) break;
        last = at;
        at += len;
        if (!size && run != 15) {
            eob = 1;
            break;
        }
        adv += step;
    }
    multi[g] = (je_multi_t)(at ? (uint)at | ((uint)adv << 5) | ((uint)eob << 11) | ((uint)last << 12) : 0u);
}

__kernel void jpeg_sync(__global const uchar *data, __global const int *meta, const int seg_at, const int img_at,
                        const int comp_at, const int tab_at, __global const int *chunk, const int nchunks,
                        __global const int *prev, __global int *next, __global int *used, __global int *settled,
                        const int round, const int last_round, const int lookback,
                        __global const je_multi_t *multi, const int multi_on, __global int *ckpt, const int resume,
                        const int skip_quiet, __global int *changed)
{
    const int j = get_global_id(0);
    /* no state changed last round: this round's states are the last's, which `next` holds already (the round
     * before last wrote them there, and they have not changed since); a segment settled then stays settled */
    if (round >= 2 && skip_quiet && changed[round - 1] == 0) return;
    if (j >= nchunks) return;
    __global const int *seg = meta + seg_at;
    __global const int *ch = chunk + j * JE_CHUNK_INTS;
    __global const int *s = seg + ch[0] * JH_SEG;
    const int first = (j == s[6]);
    __global int *o = next + j * JE_STATE;
    __global int *in = used + j * JE_USED;
    int pos, bit = 0, u = 0, k = 0, valid = 1;
    /* this chunk decoded before from a valid entry: prev holds that decode's exit and ckpt its checkpoints */
    const int again = resume && round > 0 && in[3];
    if (round > 0) {
        /* the entry is the exit of the chunk before (the first chunk's is exact and never changes); the same entry
         * as this chunk's last decode used gives the same exit: copy it */
        if (!first) {
            __global const int *e = prev + (j - 1) * JE_STATE;
            pos = e[0] >> 3; bit = e[0] & 7; u = e[1]; k = e[2]; valid = e[7];
        }
        if (first || (in[0] == pos * 8 + bit && in[1] == u && in[2] == k && in[3] == valid)) {
            for (int i = 0; i < JE_STATE; ++i) o[i] = prev[j * JE_STATE + i];
            return;
        }
    }
    __global const int *img = meta + img_at, *comp = meta + comp_at, *tab = meta + tab_at;
    __global const int *im = img + s[0] * JH_IMG;
    je_mcu m;
    je_mcu_init(&m, comp + im[2] * JH_COMP, im[1]);
    __global const je_multi_t *mt = multi_on ? multi : 0;
    int blocks = 0, d0 = 0, d1 = 0, d2 = 0;
    if (round == 0) {
        if (first) {
            pos = s[1];
        } else {
            /* a guess: start `lookback` bytes before the chunk (at the segment's start, exact, if that is nearer)
             * and decode up to the chunk, so that the decode has synchronised by the time it enters it */
            pos = max(s[1], ch[1] - lookback);
            if (pos > s[1] && data[pos - 1] == 0xFF && data[pos] == 0x00) pos += 1;  /* never inside a stuffed pair */
            if (pos < ch[1])
                je_run(data, s[2], tab, &m, &pos, &bit, &u, &k, (long)ch[1] * 8, &blocks, &d0, &d1, &d2, 0, 0, 0, 0, 0,
                       mt, 0, 0, 0, 0);
            blocks = 0; d0 = 0; d1 = 0; d2 = 0;
        }
    }
    in[0] = pos * 8 + bit; in[1] = u; in[2] = k; in[3] = valid;
    if (valid) {
        je_run(data, s[2], tab, &m, &pos, &bit, &u, &k, (long)ch[2] * 8, &blocks, &d0, &d1, &d2, 0, 0, 0, 0, 0, mt,
               ckpt + j * JE_CKPTS * JE_CK, ch[1] * 8, (ch[2] - ch[1]) * 8 / (JE_CKPTS + 1),
               again ? prev + j * JE_STATE : 0);
    }
    const int p = pos * 8 + bit;
    __global const int *was = prev + j * JE_STATE;
    const int exit_moved = was[0] != p || was[1] != u || was[2] != k || was[7] != valid;
    if (round == last_round && round > 0 && exit_moved) settled[ch[0]] = 0;
    /* any part of the state moved (the blocks and DC sums too, which a new entry moves even where the exit stays):
     * the next round has work (a flag: every writer writes the same) */
    if (round > 0 && (exit_moved || was[3] != blocks || was[4] != d0 || was[5] != d1 || was[6] != d2))
        changed[round] = 1;
    o[0] = p; o[1] = u; o[2] = k; o[3] = blocks; o[4] = d0; o[5] = d1; o[6] = d2; o[7] = valid;
}

/* jpeg_prefix_*: each chunk's entry (first block, DC predictors) as exclusive prefix sums of the blocks and DC sums
 * of the chunks before it in its segment, in three launches over all chunks: sums within work-groups of JE_SCAN
 * chunks, the work-groups' totals summed, then each chunk's sum from its batch's start less its segment's first
 * chunk's. The sums wrap (unsigned) over the batch; the differences, within a segment, are exact. */
#define JE_SCAN 256

/* the inclusive sum of v over the work-group's work-items up to this one (l: JE_SCAN uint4 of local memory) */
inline uint4 je_scan_group(const uint4 v, __local uint4 *l)
{
    const int i = get_local_id(0);
    l[i] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int d = 1; d < JE_SCAN; d <<= 1) {
        const uint4 add = (i >= d) ? l[i - d] : (uint4)(0);
        barrier(CLK_LOCAL_MEM_FENCE);
        l[i] += add;
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    return l[i];
}

__kernel __attribute__((reqd_work_group_size(JE_SCAN, 1, 1)))
void jpeg_prefix_groups(__global const int *state, const int nchunks, __global uint4 *part, __global uint4 *sums)
{
    __local uint4 l[JE_SCAN];
    const int j = get_global_id(0);
    __global const int *x = state + j * JE_STATE;
    const uint4 v = (j < nchunks) ? (uint4)((uint)x[3], (uint)x[4], (uint)x[5], (uint)x[6]) : (uint4)(0);
    const uint4 inclusive = je_scan_group(v, l);
    if (j < nchunks) part[j] = inclusive - v;
    if (get_local_id(0) == JE_SCAN - 1) sums[get_group_id(0)] = inclusive;
}

__kernel __attribute__((reqd_work_group_size(JE_SCAN, 1, 1)))
void jpeg_prefix_totals(__global uint4 *sums, const int ngroups)
{
    __local uint4 l[JE_SCAN];
    const int i = get_local_id(0);
    uint4 carry = (uint4)(0);
    for (int base = 0; base < ngroups; base += JE_SCAN) {
        const uint4 v = (base + i < ngroups) ? sums[base + i] : (uint4)(0);
        const uint4 inclusive = je_scan_group(v, l);
        if (base + i < ngroups) sums[base + i] = carry + inclusive - v;
        carry += l[JE_SCAN - 1];
        barrier(CLK_LOCAL_MEM_FENCE);  /* every work-item has read the total before the next tile's scan */
    }
}

__kernel void jpeg_prefix_entry(__global const int *meta, const int seg_at, __global const int *chunk,
                                const int nchunks, __global const uint4 *part, __global const uint4 *sums,
                                __global int *entry)
{
    const int j = get_global_id(0);
    if (j >= nchunks) return;
    const int f = meta[seg_at + chunk[j * JE_CHUNK_INTS] * JH_SEG + 6];  /* its segment's first chunk */
    const uint4 e = (part[j] + sums[j / JE_SCAN]) - (part[f] + sums[f / JE_SCAN]);
    vstore4(as_int4(e), j, entry);
}

__kernel void jpeg_decode(__global const uchar *data, __global const int *meta, const int seg_at, const int img_at,
                          const int comp_at, const int tab_at, __global const int *chunk, const int nchunks,
                          __global const int *state, __global const int *entry, __global const int *settled,
                          __global const int *ckpt, __global short *coef, __global int *status)
{
    const int g = get_global_id(0), j = g / (JE_CKPTS + 1), part = g % (JE_CKPTS + 1);
    if (j >= nchunks) return;
    __global const int *seg = meta + seg_at, *img = meta + img_at, *comp = meta + comp_at, *tab = meta + tab_at;
    __global const int *ch = chunk + j * JE_CHUNK_INTS;
    const int sg = ch[0];
    if (!settled[sg]) return;  /* left to jpeg_huffman */
    __global const int *s = seg + sg * JH_SEG;
    __global const int *im = img + s[0] * JH_IMG;
    je_mcu m;
    je_mcu_init(&m, comp + im[2] * JH_COMP, im[1]);
    __global const int *en = entry + j * JE_ENTRY;
    __global const int *ck = ckpt + j * JE_CKPTS * JE_CK;
    const int total = s[4] * m.bpm;
    int pos, bit = 0, u = 0, k = 0;
    if (j == s[6]) {
        pos = s[1];
    } else {
        __global const int *e = state + (j - 1) * JE_STATE;
        if (!e[7]) {
            if (!part) atomic_max(status + sg, JH_BAD_CODE);
            return;
        }
        pos = e[0] >> 3; bit = e[0] & 7; u = e[1]; k = e[2];
    }
    int b0 = en[0], d0 = en[1], d1 = en[2], d2 = en[3];
    if (part) {  /* from the chunk's checkpoint before this part (its last decode, from its exact entry, wrote them) */
        __global const int *c = ck + (part - 1) * JE_CK;
        if (c[0] < 0) return;  /* the chunk's decode ended before it: nothing starts here */
        pos = c[0] >> 3; bit = c[0] & 7; u = c[1]; k = 0;
        b0 += c[2]; d0 += c[3]; d1 += c[4]; d2 += c[5];
    }
    if (b0 >= total && (j != s[6] || part)) return;  /* an earlier part completed the segment and checked its end */
    const int next_ck = part < JE_CKPTS && ck[part * JE_CK] >= 0;  /* the part ends at the next checkpoint */
    const int last = (j == s[6] + s[7] - 1) && !next_ck;  /* the segment's last part */
    const long stop = next_ck ? (long)ck[part * JE_CK] : (last ? 0x7FFFFFFFFFFFL : (long)ch[2] * 8);
    int blocks = 0;
    int why = je_run(data, s[2], tab, &m, &pos, &bit, &u, &k, stop, &blocks, &d0, &d1, &d2, coef, b0, s[3], im[0],
                     total, 0, 0, 0, 0, 0);
    if (!why && last && b0 + blocks != total) why = JE_BAD_COUNT;
    if (!why && b0 + blocks == total) {
        /* this part completed the segment: libjpeg's clean end, only padding bits (< 8, within the byte at pos)
         * left, then the segment's marker */
        const int next = (bit > 0) ? pos + ((data[pos] == 0xFF) ? 2 : 1) : pos;
        if (k != 0) why = JE_BAD_COUNT;
        else if (bit > 0 && !je_is_data(data, pos, s[2])) why = JH_PAST_DATA;
        else if (s[5]) {
            if (!(next + 1 < s[2] && data[next] == 0xFF && data[next + 1] == 0xD9)) why = JH_TRAILING;
        } else if (next != s[2]) {
            why = JH_TRAILING;
        }
    }
    /* the parts of a segment run at once and more than one may find an error: the highest code is the one kept,
     * whichever order they come in */
    if (why) atomic_max(status + sg, why);
}
