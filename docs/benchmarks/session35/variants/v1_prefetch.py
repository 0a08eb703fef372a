from pathlib import Path
import sys
p = Path(sys.argv[1]); s = p.read_text()
old = """typedef struct {
    ulong acc, sm;
    int avail, lpos, pend;
} je_bits;"""
new = """typedef struct {
    ulong acc, sm;
    int avail, lpos, pend;
    uchar4 nxt;  /* the 4 bytes at lpos, loaded a refill ahead (where lpos + 4 <= end) */
} je_bits;"""
assert old in s; s = s.replace(old, new, 1)
old = """inline void je_fill(__global const uchar *d, const int end, je_bits *b)
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
"""
new = """inline void je_fill(__global const uchar *d, const int end, je_bits *b)
{
    if (b->avail <= 32 && b->lpos + 4 <= end && b->pend == INT_MAX && !je_has_ff4(b->nxt)) {
        b->acc |= (ulong)je_be4(b->nxt) << (32 - b->avail);
        b->avail += 32;
        b->lpos += 4;
        if (b->lpos + 4 <= end) b->nxt = vload4(0, d + b->lpos);  /* waited for only at the next refill */
        if (b->avail > 56) return;
    }
"""
assert old in s; s = s.replace(old, new, 1)
# after the byte loop: reload nxt
old = """        b->acc |= (ulong)x << (56 - b->avail);
        b->avail += 8;
    }
}
"""
new = """        b->acc |= (ulong)x << (56 - b->avail);
        b->avail += 8;
    }
    if (b->lpos + 4 <= end) b->nxt = vload4(0, d + b->lpos);
}
"""
assert old in s; s = s.replace(old, new, 1)
old = """    b->acc = 0; b->sm = 0; b->avail = 0; b->lpos = p >> 3; b->pend = INT_MAX;
    je_fill(d, end, b);"""
new = """    b->acc = 0; b->sm = 0; b->avail = 0; b->lpos = p >> 3; b->pend = INT_MAX;
    b->nxt = (b->lpos + 4 <= end) ? vload4(0, d + b->lpos) : (uchar4)(0xFF);
    je_fill(d, end, b);"""
assert old in s; s = s.replace(old, new, 1)
p.write_text(s)
