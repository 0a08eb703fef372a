"""Whole messages from a stream socket without waiting: the reading side of `multiprocessing.connection`'s framing
(a 4-byte big-endian length, 8 more bytes when that is -1, then a pickle), for a reader that serves many sockets
from one thread and wants every message already there, in one or two system calls, instead of one message per
wake-up.

    reader = FrameReader(sock)
    messages, closed = reader.read()     # when select says the socket is readable
    sock.sendall(frame(message))         # what Connection.recv on the other side reads
"""

from __future__ import annotations

import pickle
import socket
import struct

CHUNK = 1 << 16


def frame(message) -> bytes:
    """`message` pickled and framed as `Connection.send` frames it."""
    data = pickle.dumps(message)
    if len(data) > 0x7FFFFFFF:
        return struct.pack("!i", -1) + struct.pack("!Q", len(data)) + data
    return struct.pack("!i", len(data)) + data


class FrameReader:
    """The messages arriving on `sock` (which stays blocking for its writers: reads here never wait)."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self._buffer = bytearray()

    def read(self) -> tuple[list, bool]:
        """(every message complete now, whether the other side has closed the socket)."""
        closed = False
        while True:
            try:
                data = self.sock.recv(CHUNK, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:  # reset by a peer that died
                closed = True
                break
            if not data:
                closed = True
                break
            self._buffer += data
            if len(data) < CHUNK:
                break
        return self._messages(), closed

    def _messages(self) -> list:
        buffer, at, messages = self._buffer, 0, []
        while len(buffer) - at >= 4:
            (size,), header = struct.unpack_from("!i", buffer, at), 4
            if size == -1:
                if len(buffer) - at < 12:
                    break
                (size,), header = struct.unpack_from("!Q", buffer, at + 4), 12
            if len(buffer) - at - header < size:
                break
            messages.append(pickle.loads(buffer[at + header:at + header + size]))
            at += header + size
        if at:
            del buffer[:at]
        return messages
