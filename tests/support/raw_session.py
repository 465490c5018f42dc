"""A client session spoken by hand over a DEALER socket, for what no Producer would send.

It says HELLO and makes the memory handshake as a client does; then the test sends what it likes, and writes
what it likes into the segment's blocks and the slots of its control area (the daemon reads a slot of a block
granted to the client, when the client says WAKEUP or asks for blocks, and when its session ends).
"""

from __future__ import annotations

import os
import time
from typing import Any

import zmq

from client_stub.contract import PROTOCOL_VERSION, ipc, shared_memory
from client_stub.contract.batch_slots import ControlArea
from client_stub.contract.shared_memory import Layout, Segment
from client_stub.fastpath import encode_record
from tests.support.waiting import HANG_S

TIMESTAMP_MS = 1_700_000_000_000


class RawSession:
    """A session of this process by hand: its DEALER socket, its segment and the segment's control area."""

    def __init__(self, endpoint: str, name: str = "raw", *, context: zmq.Context | None = None) -> None:
        """``context``: the caller's (closed by the caller), else one of its own."""
        self._own_context = context is None
        self.context = zmq.Context() if context is None else context
        self.sock = self.context.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)
        # Every DELIVERY report met while waiting for another message, as its row.
        self.reports: list[list[Any]] = []
        self.next_request = 1
        self.send(ipc.Hello.TYPE, PROTOCOL_VERSION, os.getpid(), name, {})
        welcome = ipc.from_fields(self.expect(ipc.Welcome.TYPE))
        assert isinstance(welcome, ipc.Welcome)
        path = shared_memory.memory_socket_path(endpoint, welcome.daemon_id)
        self.memory, fd = shared_memory.connect(path, welcome.memory_token, 10)
        assert fd is not None, "the daemon sent no segment"
        self.client_id, self.block_count = welcome.client_id, welcome.block_count
        self.segment = Segment(fd, Layout(welcome.block_size, welcome.block_count))
        os.close(fd)
        self.control = ControlArea(self.segment.control, welcome.block_count)

    def send(self, *message: Any) -> None:
        self.sock.send(ipc.pack(*message))

    def expect(self, kind: int) -> list[Any]:
        """The next message of this kind; DELIVERY reports met on the way are kept, SEAL_NOW and TOPIC skipped."""
        deadline = time.monotonic() + HANG_S
        while time.monotonic() < deadline:
            if not self.sock.poll(100):
                continue
            message = ipc.unpack(self.sock.recv())
            if message[0] == kind:
                return message
            if message[0] == ipc.Delivery.TYPE:
                self.reports += message[1]
            else:
                assert message[0] in (ipc.SealNow.TYPE, ipc.Topic.TYPE), message
        raise AssertionError(f"no message {kind} from the daemon")

    def refused(self, *message: Any, reason: str) -> None:
        """Send ``message``; the daemon must answer with an ERROR that says ``reason``."""
        self.send(*message)
        error = self.expect(ipc.Error.TYPE)
        assert reason in error[2], error

    def blocks(self, count: int) -> list[int]:
        """``count`` blocks, granted."""
        request_id, self.next_request = self.next_request, self.next_request + 1
        self.send(ipc.Blocks.TYPE, request_id, count, False, 10_000)
        grant = self.expect(ipc.Grant.TYPE)
        assert grant[1] == request_id and len(grant[2]) == count, grant
        return list(grant[2])

    def follow(self, topic: str) -> int:
        """Follow ``topic`` (METADATA) until the daemon knows its partitions; the session's number for it."""
        self.send(ipc.Metadata.TYPE, topic)
        deadline = time.monotonic() + HANG_S
        while time.monotonic() < deadline:
            answer = ipc.from_fields(self.expect(ipc.Topic.TYPE))
            assert isinstance(answer, ipc.Topic) and answer.error is None, answer
            if answer.topic == topic and answer.partition_count is not None:
                return answer.index
        raise AssertionError(f"the daemon never knew the partitions of {topic}")

    def write_record(self, block: int, value: bytes) -> int:
        """One record of ``value`` (no key, no headers) at the start of ``block``; its length."""
        record = encode_record(0, 0, None, value, ())
        self.segment.blocks(block)[:len(record)] = record
        return len(record)

    def publish(self, block: int, *, batch_id: int, topic_index: int, length: int, records: int = 1,
                partition: int = 0, block_count: int = 1, full: bool = True, opened_ns: int | None = None,
                timestamp_ms: int = TIMESTAMP_MS) -> None:
        """Describe a batch in ``block``'s slot and publish it, as a producer does, with whatever fields the caller
        gives (any 64-bit words); the daemon looks at it at its next WAKEUP."""
        self.control.open(block, batch_id=batch_id, topic_index=topic_index, partition=partition,
                          block_count=block_count, base_timestamp=timestamp_ms,
                          opened_ns=time.monotonic_ns() if opened_ns is None else opened_ns)
        self.control.publish(block, records, length, timestamp_ms, full=full)

    def clear(self, block: int) -> None:
        """``block``'s slot as a block never used has it: nothing published, nothing claimed."""
        self.control.open(block, batch_id=0, topic_index=0, partition=0, block_count=0, base_timestamp=0,
                          opened_ns=0)

    def wakeup(self) -> None:
        self.send(ipc.Wakeup.TYPE)

    def close(self) -> None:
        """End the session (GOODBYE, and the memory connection closed): the daemon claims what it published."""
        self.send(ipc.Goodbye.TYPE)
        self.control.release()
        self.segment.close()
        self.memory.close()
        self.sock.close()
        if self._own_context:
            self.context.term()
