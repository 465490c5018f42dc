"""Kafka's framing, sans-IO: every request and response is a 4-byte big-endian size, then that many bytes.

FrameReader takes the bytes a connection read, in whatever pieces they came, and gives back the frames
they complete. The daemon's Selector reads every broker response through it, and the tests' fault
proxy and fake broker read both directions with it.
"""

from __future__ import annotations

import struct

from .primitives import ProtocolError

SIZE = struct.Struct(">i")


class InvalidFrameSize(ProtocolError):
    """A frame size below 0 or above the reader's maximum: the stream cannot be Kafka's."""

    def __init__(self, size: int, max_size: int) -> None:
        super().__init__(f"invalid frame size {size} (at most {max_size})")
        self.size = size


class FrameReader:
    """Splits a byte stream into frames (without their size prefix)."""

    __slots__ = ("max_size", "_pending")

    def __init__(self, max_size: int = 2**31 - 1) -> None:
        self.max_size = max_size
        # The start of a frame that the bytes so far did not complete.
        self._pending = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        """The frames that ``data`` completes; raises InvalidFrameSize (the stream is then unusable).

        Frames that lie whole in ``data``, most of them, are sliced out of it: one copy each, and
        nothing is shifted per frame.
        """
        frames: list[bytes] = []
        pos = 0
        pending = self._pending
        if pending:
            # First the frame an earlier read began.
            if len(pending) < 4:
                pos = 4 - len(pending)
                pending += data[:pos]
                if len(pending) < 4:
                    return frames
            (size,) = SIZE.unpack_from(pending, 0)
            if size < 0 or size > self.max_size:
                raise InvalidFrameSize(size, self.max_size)
            missing = 4 + size - len(pending)
            with memoryview(data) as view:
                pending += view[pos:pos + missing]
            pos += missing
            if pos > len(data):
                return frames
            with memoryview(pending) as view:
                frames.append(bytes(view[4:]))
            pending.clear()
        # Locals: this loop runs once per response of every broker.
        end = len(data)
        unpack, limit, append = SIZE.unpack_from, self.max_size, frames.append
        while end - pos >= 4:
            (size,) = unpack(data, pos)
            if size < 0 or size > limit:
                raise InvalidFrameSize(size, limit)
            if end - pos - 4 < size:
                break
            pos += 4
            append(data[pos:pos + size])
            pos += size
        if pos < end:
            with memoryview(data) as view:
                pending += view[pos:]
        return frames
