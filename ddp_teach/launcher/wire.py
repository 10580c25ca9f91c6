"""Length-prefixed pickle messages over pipes and sockets.

The kernel, the fork server and the workers talk in whole messages: an 8-byte
big-endian length, then a pickle. A reader that meets end-of-file in the middle
of a message knows the writer died, which is how a crashed rank is noticed.
"""
import os
import pickle
import struct

_HEADER = struct.Struct(">Q")


def encode(obj) -> bytes:
    """One message as bytes: the header followed by the pickled object."""
    body = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(body)) + body


def write_message(fd: int, obj) -> None:
    """Write one whole message to a file descriptor (blocking)."""
    data = memoryview(encode(obj))
    while data:
        written = os.write(fd, data)
        data = data[written:]


def read_exactly(fd: int, n: int) -> bytes | None:
    """Read n bytes, or return None at end-of-file (the writer is gone)."""
    chunks, remaining = [], n
    while remaining:
        chunk = os.read(fd, min(remaining, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def read_message(fd: int):
    """Read one message; None when the writer closed the pipe first."""
    header = read_exactly(fd, _HEADER.size)
    if header is None:
        return None
    body = read_exactly(fd, _HEADER.unpack(header)[0])
    return None if body is None else pickle.loads(body)


class MessageBuffer:
    """Collects bytes read without blocking and hands out whole messages.

    The kernel reads every rank's result pipe from one select loop, so it
    cannot block on a half-written message; it feeds what arrived and asks for
    the messages that are complete.
    """

    def __init__(self):
        self._data = bytearray()

    def feed(self, chunk: bytes) -> list:
        self._data += chunk
        messages = []
        while len(self._data) >= _HEADER.size:
            (length,) = _HEADER.unpack_from(self._data)
            end = _HEADER.size + length
            if len(self._data) < end:
                break
            messages.append(pickle.loads(bytes(self._data[_HEADER.size:end])))
            del self._data[:end]
        return messages

    @property
    def partial(self) -> bool:
        """True when a message was cut off (bytes left that make no message)."""
        return bool(self._data)
