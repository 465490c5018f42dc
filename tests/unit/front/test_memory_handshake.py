"""The memory handshake: a session's segment over the memory socket, the connection whose end is the end of the
client's process, and a session taken back with its segment after a restart."""

from __future__ import annotations

import fcntl
import os
import select
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from client_stub import errors
from client_stub.contract import batch_slots, ipc
from client_stub.contract.shared_memory import ERR, Layout, create_segment
from service.buffer_pool import FREE, OWNED, SEALED
from service.front.memory_handshake import HANDSHAKE_TIMEOUT_MS
from tests.support.front import (
    BLOCK,
    BLOCKS,
    Client,
    Env,
    check_ended,
    deliveries,
    ended,
    notice,
    resume_of,
    seal_two_keep_two,
)

ROOT = Path(__file__).resolve().parents[3]


# -- the memory socket ----------------------------------------------------------------------------


def test_the_segment_cannot_be_resized_by_the_client(env: Env) -> None:
    client = env.client()
    client.hello()
    assert client.fd is not None
    # The daemon maps it too: shrunk, the daemon's reads of it would fault.
    with pytest.raises(PermissionError):
        os.ftruncate(client.fd, BLOCK)
    with pytest.raises(PermissionError):
        os.ftruncate(client.fd, 2 * BLOCKS * BLOCK)
    with pytest.raises(PermissionError):
        fcntl.fcntl(client.fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE)  # nor can it be made read-only for the daemon
    assert os.fstat(client.fd).st_size == Layout(BLOCK, BLOCKS).size  # its blocks, then its control area


def test_blocks_are_refused_until_the_memory_handshake(env: Env) -> None:
    client = env.client()
    client_id = client.hello(handshake=False)
    client.send(ipc.Blocks.TYPE, 1, 2, False, 1000)
    env.pump()
    assert f"client {client_id} has no segment" in client.error()
    assert client.recv()[:2] == [ipc.GrantFailed.TYPE, 1]
    # Nor is anything of it claimed: it has no segment to publish batches in.
    client.send(ipc.Wakeup.TYPE)
    client.send(ipc.LastSeal.TYPE)
    env.pump()
    env.front.serve_due()
    assert client.quiet() and env.core.accumulator.queued_batches() == 0
    assert env.pool.free_blocks == BLOCKS and env.pool.held() == {}
    client.handshake()
    assert client.blocks(2) == [0, 1]
    assert env.pool.held_by(client_id) == 2


def test_memory_handshake_with_an_unknown_token_is_refused(env: Env) -> None:
    client = env.client()
    client.hello(handshake=False)
    conn, answer, fds = env.handshake(bytes(16))
    assert answer == ERR + b"unknown token: say HELLO first" and fds == []
    assert ended(conn)
    # The session waiting for its own token is untouched.
    assert env.session(client.client_id).connection is None
    client.handshake()
    assert env.session(client.client_id).connection is not None


def test_a_token_is_good_for_one_handshake(env: Env) -> None:
    client = env.client()
    client.hello()
    assert client.welcome is not None and client.fd is not None
    conn, answer, fds = env.handshake(client.welcome.memory_token)
    assert answer.startswith(ERR) and b"unknown token" in answer and fds == []
    assert ended(conn)
    # The session keeps its segment and its connection.
    assert env.session(client.client_id).connection is not None and not client.memory_ended()
    assert len(env.pool.held()) == 1


@pytest.mark.parametrize("data", [b"short", bytes(17), b""], ids=["short", "long", "empty"])
def test_memory_handshake_that_is_no_token_is_closed_without_answer(env: Env, data: bytes) -> None:
    client = env.client()
    client.hello(handshake=False)
    conn = env.connect_memory()
    conn.send(data)
    env.serve()
    assert ended(conn)
    assert not env.front.handshakes.due_in_ms(env.clock.now) and env.front.refusals.messages_refused == 1
    assert env.session(client.client_id).connection is None and env.pool.held() == {}


def test_memory_connection_that_sends_no_token_is_closed_after_a_while(env: Env) -> None:
    conn = env.connect_memory()
    env.clock.advance(HANDSHAKE_TIMEOUT_MS - 1)
    env.front.serve_due()
    assert not ended(conn)
    env.clock.advance(1)
    env.front.serve_due()
    assert ended(conn) and not env.front.handshakes.due_in_ms(env.clock.now)


def test_a_session_without_its_memory_handshake_ends_after_a_while(env: Env) -> None:
    # Sessions are bounded per process, and only a memory handshake says which process a session is.
    client = env.client()
    client.hello(handshake=False)
    for _ in range(HANDSHAKE_TIMEOUT_MS // 1000 - 1):
        env.clock.advance(1000)
        client.send(ipc.Heartbeat.TYPE)  # not silent, but no handshake either
        env.pump()
        env.front.serve_due()
    assert len(env.front.sessions) == 1 and env.front.next_timer_ms() == 1000
    env.clock.advance(1000)
    env.front.serve_due()
    assert not env.front.sessions
    assert client.welcome is not None
    conn, answer, _ = env.handshake(client.welcome.memory_token)
    assert answer.startswith(ERR) and b"unknown token" in answer


def test_a_segment_handed_over_without_a_resume_is_refused(env: Env) -> None:
    client = env.client()
    client_id = client.hello(handshake=False)
    fd = create_segment(Layout(BLOCK, BLOCKS), "test")
    try:
        conn, answer, fds = env.handshake(client.welcome.memory_token, fd)
    finally:
        os.close(fd)
    assert answer.startswith(ERR) and b"does not resume" in answer and fds == []
    assert ended(conn)
    assert not env.front.sessions and client_id not in env.pool.held()
    client.send(ipc.Heartbeat.TYPE)
    env.pump()
    assert client.error_with_code()[0] == ipc.ERROR_UNKNOWN_CLIENT


def test_each_client_has_a_segment_of_its_own(env: Env) -> None:
    a, b = env.client(), env.client()
    a_id, b_id = a.hello(), b.hello()
    assert a.fd is not None and b.fd is not None and a.segment is not None and b.segment is not None
    assert os.fstat(a.fd).st_ino != os.fstat(b.fd).st_ino  # two files, not two names of one
    # Blocks are numbered per client, and counted across clients against the pool.
    assert a.blocks(5) == [0, 1, 2, 3, 4]
    assert b.blocks(5) == [0, 1, 2]
    assert env.pool.free_blocks == 0
    a.segment.blocks(0)[:5] = b"AAAAA"
    b.segment.blocks(0)[:5] = b"BBBBB"
    assert bytes(a.segment.blocks(0)[:5]) == b"AAAAA"  # b's block 0 is not a's
    a.publish(notice(batch_id=1, length=5))
    b.publish(notice(batch_id=1, length=5))
    assert [(bytes(batch.records), batch.origin) for batch in env.queued()] == [(b"AAAAA", (a_id, 1)),
                                                                                  (b"BBBBB", (b_id, 1))]


def test_client_that_hangs_up_its_memory_connection_isended(env: Env) -> None:
    client, other = env.client(), env.client()
    client_id = client.hello()
    other.hello()
    sealed, unsealed = seal_two_keep_two(env, client)
    client.hang_up()
    assert len(env.front.sessions) == 1
    check_ended(env, client_id, sealed, unsealed)
    env.front.serve_due()
    assert client.quiet() and other.quiet()
    client.send(ipc.Heartbeat.TYPE)
    env.pump()
    assert client.error_with_code() == (ipc.ERROR_UNKNOWN_CLIENT, "unknown client: send HELLO first")


def test_a_client_that_sends_on_its_memory_connection_isended(env: Env) -> None:
    # After its token a client sends nothing there: one that does is not a client (and must not keep the
    # daemon's loop reading).
    client, other = env.client(), env.client()
    client_id = client.hello()
    other.hello()
    sealed, unsealed = seal_two_keep_two(env, client)
    assert client.memory is not None
    client.memory.send(b"noise")
    env.serve()
    assert [s.client_id for s in env.front.sessions] == [other.client_id]
    assert client.memory_ended()
    check_ended(env, client_id, sealed, unsealed)


def test_a_resume_holding_more_than_a_client_may_takes_back_what_it_may(env: Env) -> None:
    with restarted_daemon(env, max_blocks_per_process=2) as (old, restarted, client):
        sealed = [notice(batch_id=n, first=n) for n in range(4)]
        client_id = client.hello(hand_over=old.fd, **resume_of(env.front.daemon_id, sealed))
        assert restarted.pool.held_by(client_id) == 2
        assert [b.origin[1] for b in restarted.queued()] == [0, 1]
        assert "batch refused" in client.error() and "batch refused" in client.error()
        restarted.front.serve_due()
        assert sorted(report[0] for report in deliveries(client)) == [2, 3]


_MEMORY_CLIENT = """
import os, sys
from client_stub.contract import shared_memory
from client_stub.contract.batch_slots import ControlArea
conn, fd = shared_memory.connect(bytes.fromhex(sys.argv[1]).decode(), bytes.fromhex(sys.argv[2]), 10.0)
print("ready", os.fstat(fd).st_size, flush=True)
layout = shared_memory.Layout(int(sys.argv[3]), int(sys.argv[4]))
control = ControlArea(shared_memory.Segment(fd, layout).control, layout.block_count)
block, topic_index, opened_ns = map(int, sys.stdin.readline().split())
control.open(block, batch_id=1, topic_index=topic_index, partition=0, block_count=1, base_timestamp=1,
             opened_ns=opened_ns)
control.publish(block, 1, 100, 1)  # a record appended, the batch open
print("published", flush=True)
sys.stdin.read()
"""


def test_session_ends_when_the_process_holding_its_memory_connection_dies(env: Env) -> None:
    client = env.client()
    client_id = client.hello(handshake=False)
    assert client.welcome is not None
    # Another process does the memory handshake, as the client library does it.
    child = subprocess.Popen([sys.executable, "-c", _MEMORY_CLIENT, env.front.endpoint.memory.path.encode().hex(),
                              client.welcome.memory_token.hex(), str(BLOCK), str(BLOCKS)], cwd=ROOT,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        env.serve_until(lambda: env.session(client_id).attached)
        assert child.stdout is not None and child.stdout.readline().split() == ["ready",
                                                                                str(Layout(BLOCK, BLOCKS).size)]
        session = env.session(client_id)
        assert session.pid == child.pid  # the kernel's word, not the HELLO's
        client.blocks(2)
        # The process appends a record to a batch in block 0, and dies before the batch is due.
        assert child.stdin is not None
        child.stdin.write(f"0 {client.topic_index('t')} {env.clock() * 1_000_000}\n")
        child.stdin.flush()
        assert child.stdout.readline() == "published\n"
        connection = session.connection
        assert connection is not None
        assert not select.select([connection], [], [], 0.05)[0]  # alive: nothing to read
    finally:
        child.kill()
        child.communicate()
    env.serve_until(lambda: not env.front.sessions)
    # Its record is sent all the same.
    check_ended(env, client_id, [0], [1])


# -- a session taken back after a restart ---------------------------------------------------------


@contextmanager
def restarted_daemon(env: Env, **options: Any) -> Iterator[tuple[Client, Env, Client]]:
    """A client of ``env``'s daemon (gone, as far as the test goes), a new daemon, and a client of the new one
    that offers it the old session."""
    old = env.client()
    old.hello()
    with Env(**options) as restarted:
        client = Client(restarted)
        restarted.clients.append(client)
        yield old, restarted, client


def test_a_new_daemon_takes_back_the_segment_and_the_sealed_batches(env: Env) -> None:
    # The session of a daemon that died (env's): blocks 0..3, batches sealed in blocks 2 then 0..1, not reported;
    # block 3 granted and unused (a client seals its open batches before it offers its session).
    with restarted_daemon(env) as (old, restarted, client):
        assert old.blocks(4, contiguous=True) == [0, 1, 2, 3]
        assert old.fd is not None and old.segment is not None
        first, second = b"first batch" * 10, bytes(range(256)) * 19  # the second across a block boundary
        old.segment.blocks(2)[:len(first)] = first
        old.segment.blocks(0, 2)[:len(second)] = second
        sealed = [notice(batch_id=7, first=2, count=1, records=2, length=len(first)),
                  notice(batch_id=8, first=0, count=2, records=5, length=len(second))]
        client_id = client.hello(hand_over=old.fd, **resume_of(env.front.daemon_id, sealed))
        assert client.welcome is not None and client.welcome.resumed
        assert client.welcome.daemon_id == restarted.front.daemon_id != env.front.daemon_id
        # What its batches hold is counted against the new pool; the unused block is free again.
        assert restarted.pool.held_by(client_id) == 3 and restarted.pool.free_blocks == BLOCKS - 3
        assert [restarted.state(client_id, b) for b in range(4)] == [SEALED, SEALED, SEALED, FREE]
        # Its sealed batches are queued again, in the order sealed, their bytes read from the segment.
        batches = restarted.queued()
        assert [(b.origin, b.record_count, bytes(b.records)) for b in batches] == [
            ((client_id, 7), 2, first), ((client_id, 8), 5, second)]
        # The segment itself, not a copy of it.
        old.segment.blocks(2)[:5] = b"AFTER"
        assert bytes(batches[0].records[:5]) == b"AFTER"
        # New blocks come from the same segment.
        assert client.blocks(1) == [3]
        client.publish(notice(batch_id=9, first=3))
        assert client.quiet()
        assert [b.origin[1] for b in restarted.queued()] == [7, 8, 9]
        # Reported to it as any batch.
        batches[1].done(500, -1, None)
        restarted.front.serve_due()
        assert deliveries(client) == [[8, 0, 5, 500, -1, None]]
        assert restarted.pool.held_by(client_id) == 2


def test_a_batch_taken_back_is_not_taken_again_when_its_block_is_granted_again(env: Env) -> None:
    # Its slot says what the client published, and no claim: the daemon that had to claim it is gone.
    with restarted_daemon(env) as (old, restarted, client):
        assert old.blocks(3, contiguous=True) == [0, 1, 2]
        old.publish(notice(batch_id=5, first=2), wakeup=False)
        client_id = client.hello(hand_over=old.fd, **resume_of(env.front.daemon_id, [notice(batch_id=5, first=2)]))
        client.topic_index("t")  # it follows its topics again
        [batch] = restarted.queued()
        batch.done(9, -1, None)
        restarted.front.serve_due()
        assert deliveries(client) == [[5, 0, 1, 9, -1, None]]
        assert restarted.state(client_id, 2) == FREE
        assert sorted(client.blocks(3)) == [0, 1, 2]
        client.send(ipc.Wakeup.TYPE)
        restarted.pump()
        restarted.clock.advance(10)
        restarted.front.serve_due()
        assert restarted.queued() == [batch] and restarted.state(client_id, 2) == OWNED
        assert client.quiet()


def test_a_segment_taken_back_says_its_client_is_not_watched(env: Env) -> None:
    # Its header says until when the daemon that had it would look at its open batches: that daemon is gone, and
    # the new one watches a client from its first WAKEUP.
    with restarted_daemon(env) as (old, restarted, client):
        old.blocks(1)
        with old.control() as control:
            assert control.header(batch_slots.WATCHED_UNTIL_NS) > restarted.clock() * 1_000_000
        client.hello(hand_over=old.fd, **resume_of(env.front.daemon_id, []))
        with client.control() as control:
            assert control.header(batch_slots.WATCHED_UNTIL_NS) == 0
            assert control.header(batch_slots.SCAN_INTERVAL_NS) == 5_000_000


def test_a_resumed_notice_that_is_not_valid_is_refused_as_a_claimed_batch_is(env: Env) -> None:
    with restarted_daemon(env) as (old, restarted, client):
        sealed = [notice(batch_id=1, first=0, topic="no such/topic"), notice(batch_id=2, first=1)]
        client_id = client.hello(hand_over=old.fd, **resume_of(env.front.daemon_id, sealed))
        assert "invalid topic name" in client.error()
        assert [b.origin for b in restarted.queued()] == [(client_id, 2)]
        restarted.front.serve_due()
        [report] = deliveries(client)
        assert report[0] == 1 and isinstance(ipc.error_from_wire(report[5]), errors.InvalidRequestError)
        assert restarted.state(client_id, 0) == FREE and restarted.pool.held_by(client_id) == 1


def test_resumed_notices_naming_blocks_outside_the_pool_or_twice_fail_only_their_batches(env: Env) -> None:
    with restarted_daemon(env) as (old, restarted, client):
        sealed = [notice(batch_id=1, first=0), notice(batch_id=2, first=BLOCKS), notice(batch_id=3, first=0),
                  notice(batch_id=4, first=1)]
        client_id = client.hello(hand_over=old.fd, **resume_of(env.front.daemon_id, sealed))
        assert client.welcome is not None and client.welcome.resumed
        assert "batch refused" in client.error() and "batch refused" in client.error()
        assert [b.origin for b in restarted.queued()] == [(client_id, 1), (client_id, 4)]
        restarted.front.serve_due()
        assert sorted(report[0] for report in deliveries(client)) == [2, 3]
        assert restarted.pool.held_by(client_id) == 2


def test_a_resume_of_the_daemons_own_session_is_refused(env: Env) -> None:
    # This daemon ended that session itself (and sends, or sent, what it had of it): a new one is given.
    client = env.client()
    client_id = client.hello(**resume_of(env.front.daemon_id, [notice(batch_id=1)]))
    assert client.welcome is not None and not client.welcome.resumed
    assert env.pool.held_by(client_id) == 0 and env.core.accumulator.queued_batches() == 0
    assert client.blocks(1) == [0]


def test_a_resume_of_another_layout_is_refused(env: Env) -> None:
    client = env.client()
    client.hello(handshake=False, **resume_of("gone", [], block_size=2 * BLOCK, block_count=BLOCKS // 2))
    assert client.welcome is not None and not client.welcome.resumed
    client.handshake()
    assert env.pool.held() == {client.client_id: 0}


def test_a_resumed_session_must_hand_over_its_segment(env: Env) -> None:
    client = env.client()
    client.hello(handshake=False, **resume_of("gone", []))
    assert client.welcome is not None and client.welcome.resumed
    conn, answer, fds = env.handshake(client.welcome.memory_token)
    assert answer.startswith(ERR) and b"hands over its segment" in answer and fds == []
    assert ended(conn) and not env.front.sessions and env.pool.free_blocks == BLOCKS


def _not_a_memfd(tmp_path: Path) -> int:
    return os.open(tmp_path / "file", os.O_RDWR | os.O_CREAT)


def _pipe(tmp_path: Path) -> int:
    read, write = os.pipe()
    os.close(write)
    return read


def _too_small(tmp_path: Path) -> int:
    return create_segment(Layout(BLOCK, BLOCKS - 1), "too-small")


def _sealed(seals: int) -> Any:
    def make(tmp_path: Path) -> int:
        fd = os.memfd_create("sealed", os.MFD_ALLOW_SEALING)
        os.ftruncate(fd, Layout(BLOCK, BLOCKS).size)  # the pool's size: its seals only are wrong
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
        return fd
    return make


F_SEAL_FUTURE_WRITE = 0x10  # Linux 5.1; not in Python 3.11's fcntl


@pytest.mark.parametrize(("make", "reason"), [
    (_not_a_memfd, b"not a sealable memory file"),
    (_pipe, b"not a sealable memory file"),
    (_too_small, b"bytes, the pool's layout"),
    (_sealed(fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL), b"seals are"),
    (_sealed(fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW), b"seals are"),
    (_sealed(fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | F_SEAL_FUTURE_WRITE | fcntl.F_SEAL_SEAL), b"seals are"),
    (lambda tmp_path: os.memfd_create("unsealed"), b"seals are"),
], ids=["file", "pipe", "too-small", "may-grow", "may-be-sealed-later", "sealed-against-writes", "unsealed"])
def test_a_segment_handed_over_that_is_not_a_fit_is_refused(env: Env, tmp_path: Path, make: Any,
                                                             reason: bytes) -> None:
    client = env.client()
    client_id = client.hello(handshake=False, **resume_of("gone", [notice(batch_id=1, first=2)]))
    assert client.welcome is not None and client.welcome.resumed
    fd = make(tmp_path)
    try:
        conn, answer, fds = env.handshake(client.welcome.memory_token, fd)
    finally:
        os.close(fd)
    assert answer.startswith(ERR) and reason in answer and fds == []
    assert ended(conn)
    # Nothing of it was taken: no session, no blocks counted, no batch queued.
    assert not env.front.sessions and client_id not in env.pool.held() and env.pool.free_blocks == BLOCKS
    assert env.core.accumulator.queued_batches() == 0
