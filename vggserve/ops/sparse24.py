"""2:4 weights compressed for mma.sp (kernels/conv_tc_sparse.cl): the kept values and their metadata.

    values, meta = compress(dense)        # dense (M, K) float16, M % 16 == 0, K % 32 == 0, 2:4 along K
    dense == decompress(values, meta)     # the round trip

A row of `dense` is cut into chunks of 4 consecutive k; each chunk holds at most 2 non-zeros (`ValueError` if
not). `values` (M, K/2) keeps 2 entries per chunk (compressed columns 2c and 2c + 1 of chunk c): its non-zeros in
increasing position, then, if it has fewer than 2, zeros from its lowest free positions, so the two positions are
always distinct and increasing (mma.sp::ordered_metadata's rule too). Their positions (0-3) are a nibble per
chunk: bits 0-1 the first, bits 2-3 the second.

`meta` is laid out as the kernel's lanes load it (kernels/mma.clh's banner, PTX ISA "Matrix fragments for sparse
mma.m16n8k32 with .f16"): (M/16, K/32, 16) uint32. Word (mt, ks, 2g + h) is the metadata register of thread h
(0 or 1) of quad g for the m16n8k32 step over rows 16 mt .. 16 mt + 15 and k 32 ks .. 32 ks + 31: the four nibbles
of row 16 mt + g, k 32 ks + 16 h .. + 15 in bits 0-15 (nibble i at bit 4i), those of row 16 mt + g + 8 in bits
16-31. A work-group's metadata for one k-tile is thus one contiguous run of words per 16 rows, copied with the
values by 16-byte cp.async: the weights take half the bytes of dense plus 1/16 for the metadata.
"""

import numpy as np

CHUNK = 4  # k per chunk of 2:4
STEP = 32  # k per mma.sp m16n8k32 step
ROWS = 16  # rows per mma tile


def _chunks(dense: np.ndarray) -> np.ndarray:
    m, k = dense.shape
    if m % ROWS or k % STEP:
        raise ValueError(f"2:4 compression needs rows a multiple of {ROWS} and k of {STEP}, got {dense.shape}")
    return dense.reshape(m, k // CHUNK, CHUNK)


def positions(dense: np.ndarray) -> np.ndarray:
    """(M, K/4, 2) the two positions kept per chunk: its non-zeros, then its lowest zeros, increasing."""
    chunks = _chunks(dense)
    nz = chunks != 0
    over = np.count_nonzero(nz, axis=2) > 2
    if over.any():
        row, chunk = np.argwhere(over)[0]
        raise ValueError(f"not 2:4: row {row}, k {CHUNK * chunk}..{CHUNK * chunk + 3} holds more than 2 non-zeros")
    key = np.where(nz, 0, CHUNK) + np.arange(CHUNK)  # non-zeros first, each class by position
    first_two = np.argsort(key, axis=2, kind="stable")[:, :, :2]
    return np.sort(first_two, axis=2)


def compress(dense: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(values (M, K/2) float16, meta (M/16, K/32, 16) uint32) of a 2:4 (M, K) matrix; see the module doc."""
    dense = np.asarray(dense, dtype=np.float16)
    pos = positions(dense)
    m, k = dense.shape
    values = np.take_along_axis(_chunks(dense), pos, axis=2).reshape(m, k // 2)
    nibbles = (pos[:, :, 0] | (pos[:, :, 1] << 2)).astype(np.uint32)  # (M, K/4)
    halves = nibbles.reshape(m, k // STEP, 2, 4) << (4 * np.arange(4, dtype=np.uint32))
    halves = np.bitwise_or.reduce(halves, axis=3)  # (M, K/32, 2): 16 bits per row and 16-wide half-step
    tiles = halves.reshape(m // ROWS, 2, 8, k // STEP, 2)  # (mt, row / 8, g, ks, h)
    words = tiles[:, 0] | (tiles[:, 1] << 16)  # (mt, g, ks, h)
    meta = words.transpose(0, 2, 1, 3).reshape(m // ROWS, k // STEP, 16)
    return np.ascontiguousarray(values), np.ascontiguousarray(meta, dtype=np.uint32)


def decompress(values: np.ndarray, meta: np.ndarray) -> np.ndarray:
    """The (M, K) float16 matrix that `compress` packed."""
    mt, ks, _ = meta.shape
    m, k = mt * ROWS, ks * STEP
    words = meta.reshape(mt, ks, 8, 2).transpose(0, 2, 1, 3)  # (mt, g, ks, h)
    halves = np.stack([words & 0xFFFF, words >> 16], axis=1).reshape(m, ks, 2)  # rows 16 mt + 8 (row / 8) + g
    nibbles = (halves[..., None] >> (4 * np.arange(4, dtype=np.uint32))) & 0xF  # (M, K/32, 2, 4)
    nibbles = nibbles.reshape(m, k // CHUNK)
    pos = np.stack([nibbles & 3, nibbles >> 2], axis=2).astype(np.int64)
    dense = np.zeros((m, k // CHUNK, CHUNK), np.float16)
    kept = np.asarray(values, np.float16).reshape(m, k // CHUNK, 2)
    for i in range(2):
        np.put_along_axis(dense, pos[:, :, i:i + 1], kept[:, :, i:i + 1], axis=2)
    return dense.reshape(m, k)


def is_2_4(dense: np.ndarray) -> bool:
    """Whether every chunk of 4 consecutive k of every row has at most 2 non-zeros (K padded with zeros)."""
    d = np.asarray(dense).reshape(dense.shape[0], -1)
    k = -(-d.shape[1] // CHUNK) * CHUNK
    padded = np.zeros((d.shape[0], k), bool)
    padded[:, :d.shape[1]] = d != 0
    return bool((padded.reshape(d.shape[0], -1, CHUNK).sum(axis=2) <= 2).all())
