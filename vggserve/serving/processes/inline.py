"""Which uploads a front end decodes on its event loop rather than in a decoding thread.

The hop to a thread and back (the pool's queue, its wake-up, the GIL handed over twice, the future's callback)
costs a front end more CPU than decoding a thumbnail. An upload is decoded on the loop when its bytes are at most
INLINE_MAX_BYTES and its header says it has at most INLINE_MAX_PIXELS pixels (256 x 256: under half a millisecond
here, a 500x375 photo's decode being ~2 ms, which stays in the threads so the loop keeps answering). Only the
formats whose size the first bytes tell (JPEG, PNG, GIF) are sized; anything else, or a header that cannot be read,
goes to the threads, whose decoder then gives the error.

    pixels_of(data)         # (width, height) from the header, or None
    decodes_inline(data)    # True for a small JPEG, PNG or GIF
"""

INLINE_MAX_BYTES = 64 * 1024
INLINE_MAX_PIXELS = 256 * 256
_JPEG_SOF = frozenset((0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF))
_JPEG_NO_LENGTH = frozenset((0x01, *range(0xD0, 0xD8)))  # TEM, RSTn: markers without a length


def decodes_inline(data: bytes) -> bool:
    """Whether `data` is small enough, in bytes and in pixels, to decode on the event loop."""
    if len(data) > INLINE_MAX_BYTES:
        return False
    size = pixels_of(data)
    return size is not None and size[0] * size[1] <= INLINE_MAX_PIXELS


def pixels_of(data: bytes) -> tuple[int, int] | None:
    """(width, height) a JPEG's frame header, a PNG's IHDR or a GIF's screen descriptor states; None otherwise."""
    if data[:2] == b"\xff\xd8":
        return _jpeg_size(data)
    if data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR":
        return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    if data[:6] in (b"GIF87a", b"GIF89a") and len(data) >= 10:
        return int.from_bytes(data[6:8], "little"), int.from_bytes(data[8:10], "little")
    return None


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    """Walk the JPEG's marker segments to its start-of-frame: (width, height), or None if none comes first."""
    at, end = 2, len(data)
    while at + 4 <= end:
        if data[at] != 0xFF:
            return None
        marker = data[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        if marker in _JPEG_NO_LENGTH:
            at += 2
            continue
        if marker in _JPEG_SOF:
            if at + 9 > end:
                return None
            return int.from_bytes(data[at + 7:at + 9], "big"), int.from_bytes(data[at + 5:at + 7], "big")
        if marker in (0xD9, 0xDA):  # end of image or start of scan before any frame header
            return None
        at += 2 + int.from_bytes(data[at + 2:at + 4], "big")
    return None
