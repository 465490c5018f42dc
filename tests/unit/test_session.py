"""The client's session with the daemon, driven as a state machine: no socket, no thread, no clock (the times
are the tests')."""

from __future__ import annotations

import logging

import pytest

from client_stub.contract import PROTOCOL_VERSION, ipc, shared_memory
from client_stub.errors import SidecarUnavailableError
from client_stub.session import (
    HELLO_RETRY_S,
    Detach,
    Forget,
    HandOver,
    HoldMemory,
    MakeHandshake,
    Note,
    Outcome,
    SayGoodbye,
    SayHello,
    SendHeartbeat,
    Session,
    SessionProtocolError,
    SessionState,
    Unreported,
)

ENDPOINT = "ipc:///run/kafka-sidecar/sidecar.sock"
MEMORY_PATH = "/run/kafka-sidecar/sidecar.sock.memory"
SETTINGS = ipc.WelcomeSettings(max_request_size=1048576, linger_ms=5, max_block_ms=60000,
                               delivery_timeout_ms=120000, buffer_memory=32 << 20, heartbeat_interval_ms=3000)
T0 = 1000.0  # what time.monotonic() might say


def welcome(hello_id: int, *, daemon_id: str = "d1", client_id: int = 7, resumed: bool = False,
            settings: ipc.WelcomeSettings = SETTINGS) -> ipc.Welcome:
    return ipc.Welcome(PROTOCOL_VERSION, client_id, b"\x01" * 16, 16384, 2048, settings, daemon_id, resumed, hello_id)


def attached(daemon_id: str = "d1") -> tuple[Session, ipc.Welcome]:
    """A session through its first HELLO, WELCOME and memory handshake."""
    session = Session(ENDPOINT)
    session.start(T0)
    first = welcome(1, daemon_id=daemon_id)
    session.welcomed(first)
    session.handshake_made(taken_back=None)
    return session, first


def lost() -> tuple[Session, ipc.Welcome]:
    """An attached session whose daemon went: its second HELLO, offering the session, is said at T0 + 10."""
    session, first = attached()
    session.memory_hung_up(T0 + 10)
    return session, first


# -- a session opens ------------------------------------------------------------------------------


def test_a_session_starts_with_a_hello_and_awaits_its_welcome() -> None:
    session = Session(ENDPOINT)
    assert session.state is SessionState.IDLE
    assert session.start(T0) == Outcome((SayHello(1),))
    assert (session.state, session.welcome, session.sends_queued) == (SessionState.AWAITING_WELCOME, None, False)


def test_the_welcome_of_the_hello_asks_for_the_memory_handshake_beside_the_endpoint() -> None:
    session = Session(ENDPOINT)
    session.start(T0)
    first = welcome(1)
    assert session.welcomed(first) == MakeHandshake(first, MEMORY_PATH, resume=False)
    assert session.state is SessionState.MEMORY_HANDSHAKE
    assert session.welcome is None  # send() waits until the segment is had
    assert not session.sends_queued


def test_a_tcp_endpoint_makes_its_handshake_on_the_daemons_abstract_socket() -> None:
    session = Session("tcp://127.0.0.1:5555")
    session.start(T0)
    handshake = session.welcomed(welcome(1, daemon_id="f00d"))
    assert handshake is not None and handshake.path == "\0kafka-sidecar-f00d.memory"


def test_the_handshake_made_attaches_the_session_with_a_new_segment_and_wakes_send() -> None:
    session = Session(ENDPOINT)
    session.start(T0)
    first = welcome(1)
    session.welcomed(first)
    assert session.handshake_made(taken_back=None) == Outcome(wake=True)
    assert session.state is SessionState.ATTACHED
    assert (session.welcome, session.settings, session.sends_queued) == (first, SETTINGS, True)


def test_an_attached_session_says_it_lives_at_each_tick_and_wakes_no_one() -> None:
    session, _ = attached()
    assert session.tick(T0 + 1) == Outcome((SendHeartbeat(),))
    assert session.tick(T0 + 100) == Outcome((SendHeartbeat(),))


def test_a_hello_unanswered_is_said_again_on_a_new_socket_after_a_while() -> None:
    session = Session(ENDPOINT)
    session.start(T0)
    assert session.tick(T0 + HELLO_RETRY_S) == Outcome()
    assert session.tick(T0 + HELLO_RETRY_S + 0.5) == Outcome((SayHello(2, reconnect=True),))
    assert session.state is SessionState.AWAITING_WELCOME
    # The next is said a while after this one.
    assert session.tick(T0 + 2 * HELLO_RETRY_S + 0.5) == Outcome()
    assert session.tick(T0 + 2 * HELLO_RETRY_S + 1) == Outcome((SayHello(3, reconnect=True),))


def test_the_welcome_of_an_earlier_hello_is_ignored_and_the_last_ones_taken() -> None:
    session = Session(ENDPOINT)
    session.start(T0)
    session.tick(T0 + 6)  # HELLO 2: the first may have gone with a dying daemon's connection
    assert session.welcomed(welcome(1)) is None
    assert session.state is SessionState.AWAITING_WELCOME
    second = welcome(2)
    assert session.welcomed(second) == MakeHandshake(second, MEMORY_PATH, resume=False)


def test_a_welcome_to_an_attached_session_is_ignored_even_of_its_own_hello() -> None:
    session, first = attached()
    assert session.welcomed(welcome(1, client_id=8)) is None
    assert (session.state, session.welcome) == (SessionState.ATTACHED, first)


# -- the memory handshake fails -------------------------------------------------------------------


def handshaking() -> Session:
    session = Session(ENDPOINT)
    session.start(T0)
    session.welcomed(welcome(1))
    return session


def test_a_handshake_refused_for_a_reason_is_said_when_no_session_comes_and_the_hello_is_said_again() -> None:
    session = handshaking()
    refusal = shared_memory.HandshakeError("the daemon refused the shared memory handshake: too many sessions")
    assert session.handshake_failed(refusal, T0 + 1) == Outcome(notes=(
        Note(logging.WARNING, f"kafka-sidecar at {ENDPOINT}: {refusal}"),))
    assert (session.state, session.last_refusal) == (SessionState.AWAITING_WELCOME, str(refusal))
    assert session.tick(T0 + HELLO_RETRY_S + 0.5) == Outcome((SayHello(2, reconnect=True),))


def test_a_handshake_with_a_token_forgotten_is_no_refusal_to_report() -> None:
    # An older welcome, whose token the daemon forgot when a HELLO said again replaced it.
    session = handshaking()
    forgotten = shared_memory.HandshakeError(f"the daemon refused the shared memory handshake: "
                                             f"{shared_memory.UNKNOWN_TOKEN}")
    assert [note.level for note in session.handshake_failed(forgotten, T0 + 1).notes] == [logging.DEBUG]
    assert (session.state, session.last_refusal) == (SessionState.AWAITING_WELCOME, None)


def test_a_daemon_out_of_reach_at_the_handshake_is_greeted_again_later() -> None:
    session = handshaking()
    outcome = session.handshake_failed(ConnectionRefusedError("gone"), T0 + 1)
    assert (outcome.actions, outcome.wake) == ((), False)
    assert [note.level for note in outcome.notes] == [logging.WARNING]
    assert "cannot reach the memory socket" in outcome.notes[0].message
    assert (session.state, session.error) == (SessionState.AWAITING_WELCOME, None)
    assert session.tick(T0 + HELLO_RETRY_S + 0.5) == Outcome((SayHello(2, reconnect=True),))


def test_a_handshake_that_fails_for_what_the_daemon_handed_over_is_logged_with_its_traceback_and_said_again() -> None:
    # A WELCOME whose token is no bytes (ipc.decode checks no field's kind), a segment that cannot be mapped: a
    # daemon's bug or this client's, and no reason to end the session.
    session = handshaking()
    failure = ValueError("mmap length is greater than file size")
    outcome = session.handshake_failed(failure, T0 + 1)
    assert (outcome.actions, outcome.wake) == ((), False)
    [note] = outcome.notes
    assert (note.level, note.exc) == (logging.ERROR, failure)
    assert "failed (ValueError: mmap length is greater than file size)" in note.message
    assert (session.state, session.error) == (SessionState.AWAITING_WELCOME, None)
    assert session.tick(T0 + HELLO_RETRY_S + 0.5) == Outcome((SayHello(2, reconnect=True),))


def test_memory_this_user_may_not_have_ends_the_session_with_a_reason_and_wakes_send() -> None:
    session = handshaking()
    assert session.handshake_failed(PermissionError(13, "Permission denied"), T0 + 1) == Outcome(wake=True)
    assert session.state is SessionState.ENDED
    assert isinstance(session.error, SidecarUnavailableError)
    assert MEMORY_PATH in str(session.error) and "daemon's group" in str(session.error)
    assert session.tick(T0 + 100) == Outcome()


# -- the daemon goes, and the next takes the session back -----------------------------------------


def test_a_daemon_gone_leaves_the_session_held_and_offered_to_the_next() -> None:
    session, first = attached()
    outcome = session.memory_hung_up(T0 + 10)
    assert outcome.actions == (Detach(), HoldMemory(), SayHello(2, offer=first))
    assert outcome.wake  # a send() waiting for blocks of the session looks again
    assert [note.message for note in outcome.notes] == [
        f"lost the session with the kafka-sidecar daemon at {ENDPOINT}: connecting again"]
    assert (session.state, session.welcome, session.sends_queued) == (SessionState.LOST, None, False)
    assert session.settings == SETTINGS  # what the client works with between two daemons
    # Said again until a daemon answers, offering the session each time.
    assert session.tick(T0 + 10 + HELLO_RETRY_S + 0.5) == Outcome((SayHello(3, offer=first, reconnect=True),))


def test_the_hello_after_a_lost_session_offers_it_with_its_sealed_batches() -> None:
    session, first = lost()
    [hello] = session.tick(T0 + 10 + HELLO_RETRY_S + 0.5).actions  # said again
    assert isinstance(hello, SayHello)
    notice = ipc.SealNotice(9, 0, 2, "orders", 3, 10, 5000, 1_700_000_000_000, 1_700_000_000_010, 40)
    template = ipc.Hello(PROTOCOL_VERSION, 1234, "worker", ipc.HelloOptions(linger_ms=5, shutdown_notice=True))
    said = ipc.decode(ipc.encode(hello.message(template, [notice])))
    assert isinstance(said, ipc.Hello)
    assert (said.pid, said.options.linger_ms, said.options.shutdown_notice) == (1234, 5, True)
    assert said.options.hello_id == 3
    assert said.options.resume == [first.daemon_id, first.client_id, first.block_size, first.block_count,
                                   [list(notice)]]


def test_a_first_hello_offers_nothing() -> None:
    template = ipc.Hello(PROTOCOL_VERSION, 1234, "worker", ipc.HelloOptions())
    said = SayHello(1).message(template, [])
    assert (said.options.resume, said.options.hello_id) == (None, 1)


def test_the_next_daemon_takes_the_lost_session_back_with_its_segment() -> None:
    session, first = lost()
    second = welcome(2, daemon_id="d2", client_id=first.client_id, resumed=True)
    assert session.welcomed(second) == MakeHandshake(second, MEMORY_PATH, resume=True)
    outcome = session.handshake_made(taken_back=Unreported(batches=3, records=40))
    assert (outcome.actions, outcome.wake) == ((), True)
    assert [note.message for note in outcome.notes] == [
        "the kafka-sidecar daemon took back 3 unreported batch(es) of the lost session (40 record(s), sent again)"]
    assert (session.state, session.welcome) == (SessionState.ATTACHED, second)
    # Lost in turn, it is this session that is offered next.
    session.memory_hung_up(T0 + 20)
    assert session.tick(T0 + 20 + HELLO_RETRY_S + 0.5).actions == (SayHello(4, offer=second, reconnect=True),)


def test_a_daemon_that_ended_the_session_itself_gives_it_back() -> None:
    # It took this process for dead (silent, or reading too slowly), kept what it had, and says so.
    session, first = attached()
    session.refused(UNKNOWN, T0 + 10)
    session.welcomed(welcome(2, daemon_id=first.daemon_id, client_id=first.client_id, resumed=True))
    outcome = session.handshake_made(taken_back=Unreported(batches=1, records=5))
    assert [note.message for note in outcome.notes] == [
        "the kafka-sidecar daemon gave back the session it ended, with 1 unreported batch(es) (5 record(s))"]


def test_a_daemon_that_cannot_take_the_session_back_gives_a_new_segment_and_the_lost_one_is_forgotten() -> None:
    session, first = lost()
    second = welcome(2, daemon_id="d2", resumed=False)
    assert session.welcomed(second) == MakeHandshake(second, MEMORY_PATH, resume=False)
    assert session.handshake_made(taken_back=None) == Outcome((Forget(),), wake=True)
    # Lost in turn, it is the new session that is offered next, not the forgotten one.
    session.memory_hung_up(T0 + 20)
    assert session.tick(T0 + 20 + HELLO_RETRY_S + 0.5).actions == (SayHello(4, offer=second, reconnect=True),)


def test_a_session_not_taken_back_at_the_handshake_is_forgotten_and_a_new_one_asked_for() -> None:
    session, first = lost()
    session.welcomed(welcome(2, daemon_id="d2", resumed=True))
    refusal = shared_memory.HandshakeError("the daemon refused the shared memory handshake: not your segment")
    outcome = session.handshake_failed(refusal, T0 + 12)
    assert outcome.actions == (Forget(), SayHello(3))
    assert [note.message for note in outcome.notes] == [
        f"the kafka-sidecar daemon did not take the lost session back: {refusal}"]
    assert session.state is SessionState.AWAITING_WELCOME
    # Said again a while after this HELLO, offering nothing.
    assert session.tick(T0 + 12 + HELLO_RETRY_S) == Outcome()
    assert session.tick(T0 + 12 + HELLO_RETRY_S + 0.5) == Outcome((SayHello(4, reconnect=True),))


@pytest.mark.parametrize("failure", [ConnectionRefusedError("gone again"), TypeError("a token of no bytes")])
def test_a_handshake_that_fails_otherwise_keeps_the_lost_session_for_the_next_hello(failure: Exception) -> None:
    session, first = lost()
    session.welcomed(welcome(2, daemon_id="d2", resumed=True))
    assert session.handshake_failed(failure, T0 + 12).actions == ()
    assert session.state is SessionState.LOST
    assert session.tick(T0 + 10 + HELLO_RETRY_S + 0.5) == Outcome((SayHello(3, offer=first, reconnect=True),))


def test_a_lost_session_is_taken_back_by_the_handshake_that_offers_it_only() -> None:
    session, _ = lost()
    session.welcomed(welcome(2, daemon_id="d2", resumed=True))
    with pytest.raises(SessionProtocolError, match="taken back"):
        session.handshake_made(taken_back=None)  # the I/O thread's bug: it handed the segment over


# -- the daemon does not know the client ----------------------------------------------------------


UNKNOWN = ipc.Error(ipc.ERROR_UNKNOWN_CLIENT, "unknown client: send HELLO first")


def test_a_daemon_that_does_not_know_an_attached_client_loses_the_session() -> None:
    # It restarted, or ended the session (it took this process for dead).
    session, first = attached()
    outcome = session.refused(UNKNOWN, T0 + 10)
    assert (outcome.actions, outcome.wake) == ((Detach(), HoldMemory(), SayHello(2, offer=first)), True)
    assert [note.message for note in outcome.notes] == [
        "the kafka-sidecar daemon does not know this client any more: connecting again",
        f"lost the session with the kafka-sidecar daemon at {ENDPOINT}: connecting again"]
    assert session.state is SessionState.LOST


def test_unknown_client_before_a_session_answers_what_was_sent_before_the_hello_and_is_ignored() -> None:
    session = Session(ENDPOINT)
    session.start(T0)
    assert session.refused(UNKNOWN, T0 + 1) == Outcome()
    assert session.state is SessionState.AWAITING_WELCOME
    session, first = lost()
    assert session.refused(UNKNOWN, T0 + 11) == Outcome()
    assert session.state is SessionState.LOST
    assert session.welcomed(welcome(2)) is not None  # the HELLO of the hang-up is still the one answered


# -- the daemon shuts down ------------------------------------------------------------------------


def test_a_daemon_shutting_down_is_handed_the_last_batches_and_hears_from_the_client_while_it_drains() -> None:
    session, first = attached()
    outcome = session.shutting_down("SIGTERM")
    assert (outcome.actions, outcome.wake) == ((HandOver(),), True)
    assert [note.level for note in outcome.notes] == [logging.INFO]
    assert "is shutting down (SIGTERM)" in outcome.notes[0].message
    assert session.state is SessionState.DRAINING
    assert (session.welcome, session.shutdown_reason, session.sends_queued) == (None, "SIGTERM", False)
    assert session.tick(T0 + 10) == Outcome((SendHeartbeat(),))  # silent, it would lose the last batches' reports
    assert session.tick(T0 + 100) == Outcome((SendHeartbeat(),))  # no HELLO meanwhile: it would take another socket
    assert session.shutting_down("SIGTERM") == Outcome()
    assert session.welcomed(welcome(1)) is None


def test_a_drained_daemon_gone_leaves_the_session_offered_to_the_next_which_clears_the_shutdown() -> None:
    session, first = attached()
    session.shutting_down("SIGTERM")
    assert session.memory_hung_up(T0 + 10) == Outcome((HoldMemory(), SayHello(2, offer=first)))
    assert (session.state, session.shutdown_reason) == (SessionState.LOST, "SIGTERM")  # what send() says meanwhile
    session.welcomed(welcome(2, daemon_id="d2", resumed=True))
    session.handshake_made(taken_back=Unreported(0, 0))
    assert (session.state, session.shutdown_reason) == (SessionState.ATTACHED, None)


def test_a_draining_daemon_that_forgets_the_client_loses_the_session_without_a_second_hand_over() -> None:
    session, first = attached()
    session.shutting_down("SIGTERM")
    assert session.refused(UNKNOWN, T0 + 10).actions == (HoldMemory(), SayHello(2, offer=first))
    assert session.state is SessionState.LOST


def test_a_shutdown_before_a_session_is_ignored() -> None:
    session = Session(ENDPOINT)
    session.start(T0)
    assert session.shutting_down("SIGTERM") == Outcome()
    assert (session.state, session.shutdown_reason) == (SessionState.AWAITING_WELCOME, None)


def test_a_hello_to_a_daemon_shutting_down_is_said_again_to_the_next() -> None:
    session = Session(ENDPOINT)
    session.start(T0)
    shutting_down = ipc.Error(ipc.ERROR_SHUTTING_DOWN, "the daemon is shutting down (SIGTERM)")
    assert session.refused(shutting_down, T0) == Outcome(notes=(
        Note(logging.INFO, f"kafka-sidecar at {ENDPOINT}: the daemon is shutting down (SIGTERM)"),))
    assert (session.state, session.error) == (SessionState.AWAITING_WELCOME, None)
    assert session.tick(T0 + HELLO_RETRY_S + 0.5) == Outcome((SayHello(2, reconnect=True),))


# -- refusals and versions ------------------------------------------------------------------------


def test_a_message_refused_leaves_the_session_as_it_is() -> None:
    session, first = attached()
    assert session.refused(ipc.Error(ipc.ERROR_REFUSED, "block 9 is not yours"), T0 + 1) == Outcome(notes=(
        Note(logging.ERROR, "the kafka-sidecar daemon refused a message: block 9 is not yours"),))
    assert (session.state, session.welcome, session.error) == (SessionState.ATTACHED, first, None)


def test_a_welcome_of_another_protocol_version_ends_the_session_and_says_both_versions() -> None:
    session = Session(ENDPOINT)
    session.start(T0)
    assert session.mismatched(99) == Outcome(wake=True)
    assert session.state is SessionState.ENDED
    assert isinstance(session.error, SidecarUnavailableError)
    assert f"speaks protocol version 99, this client {PROTOCOL_VERSION}" in str(session.error)
    assert session.tick(T0 + 100) == Outcome()  # no HELLO said again: no session can be had with this daemon
    assert session.welcomed(welcome(1)) is None


def test_a_hello_refused_for_its_version_ends_the_session() -> None:
    session, _ = lost()
    message = "protocol version mismatch: the client speaks 1, this daemon speaks 2; upgrade kafka-sidecar on one side"
    assert session.refused(ipc.Error(ipc.ERROR_VERSION, message), T0 + 11) == Outcome(wake=True, notes=(
        Note(logging.ERROR, f"the kafka-sidecar daemon refused the handshake: {message}"),))
    assert session.state is SessionState.ENDED
    assert str(session.error) == f"kafka-sidecar at {ENDPOINT}: {message}"
    assert session.tick(T0 + 100) == Outcome()


def test_a_version_refusal_to_an_attached_session_leaves_it_reporting_until_it_is_lost() -> None:
    # (Only a HELLO is refused for its version: this would answer one of before the session.)
    session, _ = attached()
    session.refused(ipc.Error(ipc.ERROR_VERSION, "protocol version mismatch"), T0 + 1)
    assert session.state is SessionState.ATTACHED and session.error is not None
    assert session.tick(T0 + 2) == Outcome((SendHeartbeat(),))
    assert session.memory_hung_up(T0 + 3).actions == (Detach(), HoldMemory())
    assert session.state is SessionState.ENDED


# -- the end --------------------------------------------------------------------------------------


def test_a_stopped_session_says_goodbye_and_nothing_more() -> None:
    session, _ = attached()
    assert session.stop() == Outcome((SayGoodbye(),))
    assert (session.state, session.welcome, session.error, session.sends_queued) == (SessionState.ENDED, None, None,
                                                                                     False)
    assert session.tick(T0 + 100) == Outcome()
    assert session.memory_hung_up(T0 + 100) == Outcome()
    assert session.refused(UNKNOWN, T0 + 100) == Outcome()


def test_a_session_that_ended_says_goodbye_all_the_same() -> None:
    # What is queued goes, GOODBYE last, whatever the session: the daemon frees what this client holds at once.
    session, _ = lost()
    session.mismatched(99)
    assert session.stop() == Outcome((SayGoodbye(),))


def test_an_io_thread_that_failed_ends_the_session_with_its_error() -> None:
    session, _ = lost()
    error = SidecarUnavailableError("the producer's I/O thread stopped")
    session.fail(error)
    assert (session.state, session.error, session.welcome) == (SessionState.ENDED, error, None)
    assert session.tick(T0 + 100) == Outcome()


# -- what the I/O thread may not do ---------------------------------------------------------------


def test_events_out_of_turn_for_the_io_thread_are_its_bugs() -> None:
    session = Session(ENDPOINT)
    with pytest.raises(SessionProtocolError, match="IDLE"):
        session.tick(T0)  # before the start
    session.start(T0)
    with pytest.raises(SessionProtocolError, match="AWAITING_WELCOME"):
        session.start(T0)
    with pytest.raises(SessionProtocolError, match="AWAITING_WELCOME"):
        session.handshake_made(taken_back=None)  # no handshake asked for
    session.welcomed(welcome(1))
    with pytest.raises(SessionProtocolError, match="MEMORY_HANDSHAKE"):
        session.welcomed(welcome(1))  # the handshake's outcome comes first
    with pytest.raises(SessionProtocolError, match="MEMORY_HANDSHAKE"):
        session.tick(T0 + 1)
