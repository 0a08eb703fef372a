"""The layouts the sparse kernels read (vggserve/ops/sparse_formats.py), decoded back to the dense weights (no
device)."""

import re

import numpy as np
import pytest

from vggserve.ops.sparse_formats import codegen_cases, csr, float_literal, groups, tap_masks, weights_digest
from vggserve.weights.prune import prune_unstructured


def pruned(rng, shape, sparsity):
    return prune_unstructured(rng.standard_normal(shape).astype(np.float32), sparsity)


def decode_tap_masks(fmt, m, c, ocg):
    """The dense (M, C, 3, 3) weights a tap-mask format describes, checking the chunk and group bookkeeping."""
    out = np.zeros((m, c * 9), np.float32)
    for g in range(groups(m, ocg)):
        last_k = -1
        for ch in range(fmt.gchunk[g], fmt.gchunk[g + 1]):
            vi, vend = int(fmt.vptr[ch]), int(fmt.vptr[ch + 1])
            for head in fmt.heads[fmt.cptr[ch]:fmt.cptr[ch + 1]].tolist():
                k = (head >> 20) * 9 + ((head >> 18) & 3) * 3 + ((head >> 16) & 3)
                assert k > last_k and head & 0xFFFF  # taps in increasing k, each with a weight
                last_k = k
                for j in range(ocg):
                    if head >> j & 1:
                        out[g * ocg + j, k] = fmt.vals[vi]
                        vi += 1
            assert vi == vend  # a chunk's values are its headers' values
    assert fmt.vals[-1] == 0 and fmt.vals.size == fmt.nnz + 1
    return out.reshape(m, c, 3, 3)


@pytest.mark.parametrize("m, c, ocg, chunk", [(1, 1, 1, None), (5, 3, 2, None), (33, 17, 8, 20), (16, 64, 16, 17),
                                              (7, 130, 3, 64)])
@pytest.mark.parametrize("sparsity", [0.0, 0.5, 0.9, 0.99, 1.0])
def test_tap_masks_decode_to_the_weights(rng, m, c, ocg, chunk, sparsity):
    w = pruned(rng, (m, c, 3, 3), sparsity)
    fmt = tap_masks(w, ocg, chunk)
    assert fmt.nnz == np.count_nonzero(w)
    np.testing.assert_array_equal(decode_tap_masks(fmt, m, c, ocg), w)
    if chunk:
        assert (np.diff(fmt.cptr) + np.diff(fmt.vptr) <= chunk).all()
    else:
        assert (np.diff(fmt.gchunk) <= 1).all()  # one chunk per group (none for an empty group)


def test_tap_masks_refuse_what_the_header_cannot_hold():
    with pytest.raises(ValueError, match="1 to 16 channels"):
        tap_masks(np.ones((17, 1, 3, 3), np.float32), 17)
    with pytest.raises(ValueError, match="fewer than 4096 input channels"):
        tap_masks(np.ones((1, 4096, 3, 3), np.float32), 1)
    with pytest.raises(ValueError, match="cannot hold a tap entry"):
        tap_masks(np.ones((8, 2, 3, 3), np.float32), 8, chunk=8)


@pytest.mark.parametrize("shape", [(1, 1), (7, 5), (64, 300), (3, 70000)])
@pytest.mark.parametrize("sparsity", [0.0, 0.9, 1.0])
def test_csr_decodes_to_the_weights(rng, shape, sparsity):
    w = pruned(rng, shape, sparsity)
    c = csr(w)
    assert c.cols.dtype == (np.uint16 if shape[1] <= 65536 else np.uint32)
    dense = np.zeros(shape, np.float32)
    for m in range(shape[0]):
        cols = c.cols[c.rowptr[m]:c.rowptr[m + 1]].astype(np.int64)
        assert (np.diff(cols) > 0).all()
        dense[m, cols] = c.vals[c.rowptr[m]:c.rowptr[m + 1]]
    np.testing.assert_array_equal(dense, w)
    assert c.nbytes == 4 * (shape[0] + 1) + c.vals.size * (4 + c.cols.itemsize)


def test_float_literals_read_back_exactly(rng):
    values = np.concatenate([rng.standard_normal(2000).astype(np.float32) * 10.0 ** rng.integers(-30, 30, 2000),
                             np.array([1, -2, 3e-38, 1e-45, 3.4e38, 0.1], np.float32)]).astype(np.float32)
    for v in values:
        text = float_literal(v)
        assert text.endswith("f") and re.fullmatch(r"-?\d+(\.\d*)?(e[-+]\d+)?f", text), text
        assert np.float32(text[:-1]) == v
    with pytest.raises(ValueError, match="cannot compile"):
        float_literal(np.inf)


def decode_cases(text, m, c, ocg):
    """The dense weights the generated `case` blocks describe."""
    out = np.zeros((m, c * 9), np.float32)
    for block in re.finditer(r"case (\d+): \{(.*?)\} break;", text, re.S):
        g, tap = int(block.group(1)), None
        for token in re.finditer(r"L\((\d+),(\d+),(\d+)\)|A\((\d+),([^)]*)\)", block.group(2)):
            if token.group(1) is not None:
                tap = (int(token.group(1)) * 3 + int(token.group(2))) * 3 + int(token.group(3))
            else:
                out[g * ocg + int(token.group(4)), tap] = np.float32(token.group(5)[:-1])
    return out.reshape(m, c, 3, 3)


@pytest.mark.parametrize("sparsity", [0.0, 0.5, 0.99, 1.0])
def test_codegen_cases_hold_exactly_the_non_zeros(rng, sparsity):
    w = pruned(rng, (21, 11, 3, 3), sparsity)
    text = codegen_cases(w, 4, seg_taps=5)
    np.testing.assert_array_equal(decode_cases(text, 21, 11, 4), w)
    assert text.count("A(") == np.count_nonzero(w)
    assert text.count("G(") == text.count("\nE\n")  # every segment is closed
    seg_sizes = [part.count("L(") for part in text.split("G(")[1:]]
    assert all(size <= 5 for size in seg_sizes)


def test_weights_digest_changes_with_one_weight_and_the_grouping(rng):
    w = pruned(rng, (8, 4, 3, 3), 0.5)
    v = w.copy()
    v[3, 2, 1, 0] = np.nextafter(v[3, 2, 1, 0], np.float32(9))
    assert weights_digest(w, 4) == weights_digest(w.copy(), 4)
    assert weights_digest(w, 4) != weights_digest(v, 4) and weights_digest(w, 4) != weights_digest(w, 8)
