"""`--decode auto` on a GPU engine: whether a JPEG the device decoder takes is decoded in the front end or sent
compressed to the engine's device, upload by upload, by the front end's load.

Both paths give the same pixels (the device decodes bit for bit as --decode exact), so the choice only balances the
work: decoding on the device adds to the network's time on the same GPU (about 2.9 ms per 64 images against 8.6 ms
of FP16 network on an H200), while decoding on the CPU costs the front end's cores. Under `auto` a front end decodes
an upload itself while it has a decoding thread to spare, and sends the rest to the device:

    decoding threads (RemoteBackend, LocalBackend): the thread that takes an upload decodes it itself when another
        of the front end's decoding threads is idle (`busy < decoders`, itself counted), so the next upload never
        waits behind a decode; when every other thread is busy it sends the JPEG compressed and is free again after
        the header parse (about 0.02 ms). At most `decoders - 1` uploads are decoded on the CPU at once.
    decoding processes (LocalBackend with --preprocess-procs): an upload goes to a process while one is idle.

`busy` is a deque's length (appends and pops are atomic in CPython): no lock, and an upload counts only while a
thread (or process) has it, so a request cancelled while it waits for one leaves nothing behind. `--decode gpu`
has no router: every JPEG the device takes goes to it.
"""

from __future__ import annotations

from collections import deque

SPARE_CPU = "spare_cpu"  # vggserve_decoded_images_total{path="cpu"}'s reason for a JPEG decoded here by choice


class DecodeRouter:
    """Counts the uploads a front end's `decoders` (threads, or processes) hold; `with router:` around each."""

    def __init__(self, decoders: int):
        if decoders < 1:
            raise ValueError(f"a decode router needs at least one decoder, got {decoders}")
        self.decoders = decoders
        self._busy: deque = deque()

    @property
    def busy(self) -> int:
        return len(self._busy)

    def spare(self) -> bool:
        """Whether the upload at hand is decoded on the CPU: some decoder is idle, the caller's own thread (inside
        `with router:`) counted as busy."""
        return len(self._busy) < self.decoders

    def __enter__(self) -> DecodeRouter:
        self._busy.append(None)
        return self

    def __exit__(self, *exc) -> None:
        self._busy.pop()


def decode_router(decode: str, decoders: int) -> DecodeRouter | None:
    """The router of a front end with `decoders` decoding threads (or processes) under --decode `decode`: one under
    auto, none under gpu (every JPEG the device takes goes to it) and the CPU-only modes."""
    return DecodeRouter(decoders) if decode == "auto" else None
