"""Replies: the only code that sends on the ROUTER socket.

A session gets every message, in order, or its session ends: what ZeroMQ will not queue
(the client reads slower than the daemon answers) waits in the session, up to
sidecar.client.reply.buffer.bytes, and past that, or once the client's socket is gone,
the session ends, kept for its client (its reports wait for it). An answer to a socket
without a session is dropped, and counted, if ZeroMQ will not take it.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable

import zmq

from client_stub.contract import ipc

from .sessions import ClientSession, SessionState, SessionTable

log = logging.getLogger(__name__)

# ZeroMQ queues at most this many messages for one client; past them, its replies wait in its session, up to
# sidecar.client.reply.buffer.bytes, and past that its session ends. So the memory a client that does not
# read holds is bounded: this many messages of a few KB at most (a DELIVERY of 256 reports is about 10 KB),
# and the session's buffer.
SEND_HWM = 256
# Before its memory handshake a session is no process's, so none of the per-process limits holds it: at most
# this many bytes of replies it does not read.
_REPLY_BYTES_BEFORE_HANDSHAKE = 65536
# pyzmq's flags are enum.Flag members, whose | runs Python code: once per message here, so plain ints.
_NOBLOCK = int(zmq.NOBLOCK)
_SNDMORE = int(zmq.SNDMORE)


class Replies:
    """Every message to the clients, with the backpressure of those that read slowly."""

    def __init__(self, socket: zmq.Socket[bytes], sessions: SessionTable, reply_buffer_bytes: int,
                 end_unread: Callable[[ClientSession], None]) -> None:
        """``end_unread`` ends a session whose client does not read its replies, keeping it for the client."""
        self.socket = socket
        self.sessions = sessions
        self.reply_buffer_bytes = reply_buffer_bytes
        self._end_unread = end_unread
        # Answers to a socket without a session that ZeroMQ would not take (its reader is slow or gone).
        self.replies_dropped = 0
        # Sessions ended because their clients did not read their replies, or their sockets went.
        self.sessions_ended_unread = 0

    def send(self, to: ClientSession | bytes, message: ipc.Message) -> None:
        """Send a message to a session, or an answer to a ZeroMQ identity without one."""
        payload = ipc.encode(message)
        if isinstance(to, bytes):
            if self._route(to, payload) is not True:
                self.replies_dropped += 1
            return
        if not self.sessions.is_live(to):
            # Its session ended while a handler or the loop still held it: reports are kept if it is.
            if isinstance(message, ipc.Delivery) and to.state is SessionState.KEPT:
                to.reports.extend(message.reports)
            return
        if to.waiting:
            self._keep_waiting(to, message, payload)
            return
        sent = self._route(to.identity, payload)
        if sent is False:
            self._keep_waiting(to, message, payload)
        elif sent is None:
            to.waiting.append((message, payload))  # for the session's end to keep, if it is a report
            self._unread(to, "its socket is gone")

    def send_waiting(self, session: ClientSession) -> None:
        """Hand ZeroMQ what waits for a client, in order, while it takes it."""
        waiting = session.waiting
        while waiting:
            _, payload = waiting[0]
            sent = self._route(session.identity, payload)
            if sent is None:
                self._unread(session, "its socket is gone")
                return
            if not sent:
                return
            waiting.popleft()
            session.waiting_bytes -= len(payload)

    @staticmethod
    def take_waiting_reports(session: ClientSession) -> list[ipc.DeliveryReport]:
        """Drop what waits for a session that ends, but for its reports, which are returned (the rest, grants
        and errors, mean nothing past its end)."""
        reports = [report for message, _ in session.waiting if isinstance(message, ipc.Delivery)
                   for report in message.reports]
        session.waiting.clear()
        session.waiting_bytes = 0
        return reports

    def _route(self, identity: bytes, payload: bytes) -> bool | None:
        """Hand a message to ZeroMQ: True, or False if the client's queue is full, None if its socket is gone."""
        try:
            # send_multipart() without its per-frame type checks and flag arithmetic.
            self.socket.send(identity, _NOBLOCK | _SNDMORE)
            self.socket.send(payload, _NOBLOCK)
        except zmq.Again:
            return False
        except zmq.ZMQError as exc:
            if exc.errno != errno.EHOSTUNREACH:
                raise
            return None
        return True

    def _keep_waiting(self, session: ClientSession, message: ipc.Message, payload: bytes) -> None:
        """Keep a reply ZeroMQ would not queue until the client reads; past what a session may hold, end it."""
        session.waiting.append((message, payload))
        session.waiting_bytes += len(payload)
        if session.connection is None and session.waiting_bytes > _REPLY_BYTES_BEFORE_HANDSHAKE:
            self._unread(session, f"{session.waiting_bytes} bytes of replies wait for it before its memory "
                                  "handshake")
        elif session.waiting_bytes > self.reply_buffer_bytes:
            self._unread(session, f"{session.waiting_bytes} bytes of replies wait for it, past "
                                  f"sidecar.client.reply.buffer.bytes ({self.reply_buffer_bytes})")

    def _unread(self, session: ClientSession, reason: str) -> None:
        self.sessions_ended_unread += 1
        log.warning("%s does not read its replies: %s; ending its session (its sealed batches are still sent, "
                    "their reports kept for it until it connects again)", session.describe(), reason)
        self._end_unread(session)
