"""Lanes: forward passes an engine runs on its device at once, each on an in-order queue of its own (engine.py).

Kept apart from the engine so that the settings and the command line know the limit without loading OpenCL.
"""

from dataclasses import dataclass

MAX_LANES = 4


@dataclass
class Lane:
    """One in-order queue of forward passes and the device buffers only it writes."""

    queue: object
    ping: object
    pong: object
    logits: object
    probs: object

    def release(self) -> None:
        for buf in (self.ping, self.pong, self.logits, self.probs):
            buf.release()
