"""Pruned weights in the layouts the sparse kernels read (numpy only; kernels/conv_sparse_*.cl, fc_sparse.cl).

  tap masks   conv_sparse_compressed.cl: per group of `ocg` output channels, a header per tap with a weight (its
              position and which channels) and the group's non-zeros in header order, cut into chunks of whole taps;
  CSR         fc_sparse.cl: row pointers, 16- or 32-bit column indices, values;
  codegen     conv_sparse_codegen.cl: the `case` blocks with the weights as float literals.
Every layout lists a group's or row's non-zeros in increasing k (k = (ci * 3 + ky) * 3 + kx for a convolution),
the order the kernels sum them in.
"""

import hashlib
from dataclasses import dataclass

import numpy as np

CI_LIMIT = 1 << 12  # the tap header's 12 bits of input channel
MAX_MASK_GROUP = 16  # the tap header's 16 mask bits
CODEGEN_VERSION = "1"  # part of a generated program's cache key: bump when codegen_cases' output changes


def groups(m: int, ocg: int) -> int:
    return -(-m // ocg)


def _group_taps(w2: np.ndarray, g: int, ocg: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For output-channel group g of the (M, K) matrix w2: (tap k of each non-zero, its channel j in the group, its
    value), in increasing k, then j."""
    sub = w2[g * ocg:(g + 1) * ocg].T  # (K, j)
    k, j = np.nonzero(sub)
    return k, j, sub[k, j]


@dataclass
class TapMasks:
    heads: np.ndarray   # uint32 tap headers, all groups one after another
    vals: np.ndarray    # float32 non-zeros in header order, then one 0 (the kernels' branch-free read past the end)
    cptr: np.ndarray    # int32, chunk c = heads[cptr[c]:cptr[c + 1]]
    vptr: np.ndarray    # int32, chunk c's values = vals[vptr[c]:vptr[c + 1]]
    gchunk: np.ndarray  # int32, group g = chunks gchunk[g] .. gchunk[g + 1] - 1
    nnz: int

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.heads, self.vals, self.cptr, self.vptr, self.gchunk))


def tap_masks(weight: np.ndarray, ocg: int, chunk: int | None = None) -> TapMasks:
    """(M, C, 3, 3) float32 weights -> the tap masks of groups of `ocg` channels, cut into chunks of at most `chunk`
    words, headers and values together (None: one chunk per group). See kernels/conv_sparse_compressed.cl."""
    m, c = weight.shape[:2]
    if not 1 <= ocg <= MAX_MASK_GROUP:
        raise ValueError(f"the tap-mask format takes groups of 1 to {MAX_MASK_GROUP} channels, got {ocg}")
    if chunk is not None and chunk < 1 + ocg:
        raise ValueError(f"chunks of {chunk} words cannot hold a tap entry of up to {1 + ocg} words")
    if c >= CI_LIMIT:
        raise ValueError(f"the tap-mask format takes fewer than {CI_LIMIT} input channels, got {c}")
    w2 = np.ascontiguousarray(weight, dtype=np.float32).reshape(m, -1)
    heads, vals, cptr, vptr, gchunk = [], [], [0], [0], [0]
    for g in range(groups(m, ocg)):
        k, j, v = _group_taps(w2, g, ocg)
        first = np.r_[True, k[1:] != k[:-1]] if k.size else np.zeros(0, bool)
        tap_k = k[first]
        counts = np.diff(np.r_[np.flatnonzero(first), k.size])
        masks = np.zeros(tap_k.size, np.uint32)
        np.add.at(masks, np.cumsum(first) - 1, np.left_shift(np.uint32(1), j.astype(np.uint32)))
        ci, tap = np.divmod(tap_k, 9)
        heads.append((ci.astype(np.uint32) << 20) | ((tap // 3).astype(np.uint32) << 18)
                     | ((tap % 3).astype(np.uint32) << 16) | masks)
        vals.append(v)
        h_base, v_base = cptr[-1], vptr[-1]
        words = np.cumsum(1 + counts)  # words (headers and values) up to the end of each tap
        values = np.cumsum(counts)
        taps_done = 0
        while taps_done < tap_k.size:  # greedy chunks of whole taps
            done_words = words[taps_done - 1] if taps_done else 0
            taps_done = tap_k.size if chunk is None else int(np.searchsorted(words, done_words + chunk, side="right"))
            cptr.append(h_base + taps_done)
            vptr.append(v_base + int(values[taps_done - 1]))
        gchunk.append(len(cptr) - 1)
    cat = lambda parts, dt: np.concatenate(parts).astype(dt) if parts else np.zeros(0, dt)  # noqa: E731
    all_vals = np.r_[cat(vals, np.float32), np.float32(0)].astype(np.float32)
    return TapMasks(cat(heads, np.uint32), all_vals, np.array(cptr, np.int32), np.array(vptr, np.int32),
                    np.array(gchunk, np.int32), int(all_vals.size - 1))


@dataclass
class Csr:
    rowptr: np.ndarray  # int32, M + 1
    cols: np.ndarray    # uint16 when K <= 65536, else uint32
    vals: np.ndarray    # float32

    @property
    def col16(self) -> bool:
        return self.cols.dtype == np.uint16

    @property
    def nbytes(self) -> int:
        return self.rowptr.nbytes + self.cols.nbytes + self.vals.nbytes


def csr(weight: np.ndarray) -> Csr:
    """(M, K) float32 -> CSR by rows, columns increasing within a row."""
    w2 = np.ascontiguousarray(weight, dtype=np.float32).reshape(weight.shape[0], -1)
    rows, cols = np.nonzero(w2)
    rowptr = np.zeros(w2.shape[0] + 1, np.int64)
    np.add.at(rowptr, rows + 1, 1)
    col_type = np.uint16 if w2.shape[1] <= 1 << 16 else np.uint32
    return Csr(np.cumsum(rowptr).astype(np.int32), cols.astype(col_type), w2[rows, cols])


def float_literal(value) -> str:
    """A C float literal that reads back as exactly this float32 (numpy's shortest round-trip digits, + 'f')."""
    v = np.float32(value)
    if not np.isfinite(v):
        raise ValueError(f"cannot compile the weight {v} into code")
    text = str(v)
    return text + "f" if ("." in text or "e" in text) else text + ".0f"


def codegen_cases(weight: np.ndarray, ocg: int, seg_taps: int = 32) -> str:
    """The `case g:` blocks conv_sparse_codegen.cl includes: per group of `ocg` output channels, each tap with a
    non-zero weight as L(ci,ky,kx) followed by A(j,w) per non-zero; groups with no weight at all get no block.

    Every `seg_taps` taps are wrapped in G(i) ... E, a branch on a kernel argument the compiler cannot see through
    (always taken), numbered i = 0, 1, ... over the whole program. It cuts the code into basic blocks of bounded
    size: LLVM's instruction selection is superlinear in the size of a basic block, and one block per group made a
    3,700-weight layer take a minute to build through PoCL (docs/sparse.md)."""
    m = weight.shape[0]
    w2 = np.ascontiguousarray(weight, dtype=np.float32).reshape(m, -1)
    out, seg = [], 0
    for g in range(groups(m, ocg)):
        k, j, vals = _group_taps(w2, g, ocg)
        if not k.size:
            continue
        out.append(f"case {g}: {{\n")
        terms = [f" A({jj},{float_literal(v)})" for jj, v in zip(j.tolist(), vals)]
        new_tap = np.r_[True, k[1:] != k[:-1]]
        taps = 0
        for i, (kk, starts) in enumerate(zip(k.tolist(), new_tap.tolist())):
            if starts:
                if taps % seg_taps == 0:
                    out.append(("\nE\n" if taps else "") + f"G({seg})\n")
                    seg += 1
                elif i:
                    out.append("\n")
                ci, tap = divmod(kk, 9)
                out.append(f"L({ci},{tap // 3},{tap % 3})")
                taps += 1
            out.append(terms[i])
        out.append("\nE\n} break;\n")
    return "".join(out)


def weights_digest(weight: np.ndarray, *parts) -> str:
    """sha256 of the weights' float32 bytes and shape, and of `parts` (e.g. the grouping)."""
    h = hashlib.sha256()
    w = np.ascontiguousarray(weight, dtype=np.float32)
    h.update(repr((w.shape, CODEGEN_VERSION) + tuple(parts)).encode())
    h.update(memoryview(w).cast("B"))
    return h.hexdigest()
