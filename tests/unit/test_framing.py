"""FrameReader: Kafka's size-prefixed frames out of a byte stream, in whatever pieces it arrives."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from service.protocol.framing import SIZE, FrameReader, InvalidFrameSize


def framed(*frames: bytes) -> bytes:
    return b"".join(SIZE.pack(len(frame)) + frame for frame in frames)


@given(st.lists(st.binary(max_size=300), max_size=8), st.lists(st.integers(1, 64), min_size=1))
def test_frames_come_out_whole_however_the_stream_is_cut(frames: list[bytes], cuts: list[int]) -> None:
    stream = framed(*frames)
    reader = FrameReader()
    out: list[bytes] = []
    pos = 0
    for length in cuts * (len(stream) // sum(cuts) + 1):
        out += reader.feed(stream[pos:pos + length])
        pos += length
        if pos >= len(stream):
            break
    assert out == frames
    # Nothing of the stream is left behind: the next frame comes out alone.
    assert reader.feed(framed(b"next")) == [b"next"]


def test_a_partial_frame_waits_for_the_rest() -> None:
    reader = FrameReader()
    stream = framed(b"first", b"second")
    assert reader.feed(stream[:2]) == []  # half of the size
    assert reader.feed(stream[2:12]) == [b"first"]  # the second frame begun
    assert reader.feed(stream[12:]) == [b"second"]
    assert reader.feed(b"") == []
    assert reader.feed(framed(b"next")) == [b"next"]  # nothing was left behind


@pytest.mark.parametrize("pieces", [[framed(b"x" * 11)], [framed(b"ok"), SIZE.pack(11)], [SIZE.pack(-1)],
                                    [SIZE.pack(11)[:3], SIZE.pack(11)[3:]]])
def test_a_size_out_of_bounds_is_refused(pieces: list[bytes]) -> None:
    reader = FrameReader(max_size=10)
    with pytest.raises(InvalidFrameSize, match=r"invalid frame size (11|-1) \(at most 10\)"):
        for piece in pieces:
            reader.feed(piece)
