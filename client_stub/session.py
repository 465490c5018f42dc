"""The producer's session with the daemon, as a state machine that does no I/O (as h11's connection).

HELLO, its WELCOME, the memory handshake that hands the client its segment, then
the session; when the daemon is gone (its memory connection hung up) or does not
know the client any more, the session is lost: its segment and the batches sealed
but not reported are held for the next daemon, which the next HELLO offers them to
(a resume). A daemon that shuts down says SHUTDOWN first: the client hands it its
last batches and keeps saying it lives while the daemon delivers them.

:class:`Session` takes events (the daemon's messages, the handshake's outcome, the
memory connection hung up, a timer tick, stop) and returns their :class:`Outcome`:
what to do (messages to say, what to seal, forget or fail), whether to wake send(),
and what to log; a WELCOME asks for a handshake to make. The I/O thread
(:mod:`.io_thread`) does it. No socket, thread, clock or log in here: times are passed
in. Every method is called with the producer's lock held, which also guards what
send() reads of the session (``welcome``, ``settings``, ``error``...); what it has to
log is written once that lock is released (a logging handler may send through this
very producer, or take its time).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from .contract import PROTOCOL_VERSION, ipc, shared_memory
from .errors import KafkaError, SidecarUnavailableError

# How long a HELLO may go unanswered before it is said again (one said while the daemon was going down may
# have gone with its connection).
HELLO_RETRY_S = 5.0


class SessionState(enum.Enum):
    """Where the session is."""

    # No HELLO said yet: the I/O thread has not started.
    IDLE = "idle"
    # A HELLO said, and no session held: said again every HELLO_RETRY_S until its WELCOME comes.
    AWAITING_WELCOME = "awaiting welcome"
    # The WELCOME of the last HELLO came: the I/O thread makes the memory handshake, whose outcome it says.
    MEMORY_HANDSHAKE = "memory handshake"
    # The session is open: records go to the segment, the fast path takes them.
    ATTACHED = "attached"
    # The daemon said SHUTDOWN and was handed this client's last batches, which it delivers before it goes:
    # heartbeats go on meanwhile, and new records wait for the next daemon.
    DRAINING = "draining"
    # The daemon is gone, or does not know this client any more: the segment and the sealed batches are held
    # for the next daemon, which each HELLO offers them to, said again every HELLO_RETRY_S.
    LOST = "lost"
    # No session any more: GOODBYE said, the I/O thread failed, or no daemon can serve this client (one of
    # another protocol version, or whose memory this user may not have).
    ENDED = "ended"


class SessionProtocolError(RuntimeError):
    """An event the session's state does not allow: a bug of what feeds it, not the daemon's (the daemon's
    messages that come out of turn are ignored, as the protocol expects some to be)."""


# -- what the session asks for ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SayHello:
    """Say HELLO (on a new socket if ``reconnect``: what the old one queued is dropped), offering the lost
    session whose welcome is ``offer`` if there is one."""

    hello_id: int
    offer: ipc.Welcome | None = None
    reconnect: bool = False

    def message(self, hello: ipc.Hello, sealed: Sequence[ipc.SealNotice]) -> ipc.Hello:
        """``hello`` (the producer's) as this HELLO, offering the batches ``sealed`` with the lost session."""
        lost = self.offer
        resume = None if lost is None else list(ipc.Resume(lost.daemon_id, lost.client_id, lost.block_size,
                                                           lost.block_count, [list(notice) for notice in sealed]))
        return hello._replace(options=hello.options._replace(resume=resume, hello_id=self.hello_id))


@dataclass(frozen=True, slots=True)
class SendHeartbeat:
    """Say that this client lives."""


@dataclass(frozen=True, slots=True)
class MakeHandshake:
    """Make the memory handshake of ``welcome`` at ``path``, handing over the lost session's segment if
    ``resume`` (the daemon said it takes the session back), then say its outcome."""

    welcome: ipc.Welcome
    path: str
    resume: bool


@dataclass(frozen=True, slots=True)
class HandOver:
    """The daemon shuts down: stop taking records, seal what is open and hand it the session's last batches
    (LASTSEAL); the blocks granted go with the session."""


@dataclass(frozen=True, slots=True)
class Detach:
    """The session is lost while attached: stop taking records, seal what is open (the next daemon gets it
    with the sealed batches), drop the blocks granted and what waits to be sent."""


@dataclass(frozen=True, slots=True)
class HoldMemory:
    """Keep the lost session's memory connection open, out of the poll: a daemon that ended the session itself
    keeps what it had of it while the connection is open."""


@dataclass(frozen=True, slots=True)
class Forget:
    """The lost session is gone and nobody took it back: fail its records (their fate is unknown), close its
    segment and its memory connection."""


@dataclass(frozen=True, slots=True)
class SayGoodbye:
    """The producer closes: send what is queued, then GOODBYE (the daemon claims what it published), whatever the
    session's state."""


# What the I/O thread carries out under the producer's lock (MakeHandshake is made without it).
Action = SayHello | SendHeartbeat | HandOver | Detach | HoldMemory | Forget | SayGoodbye


@dataclass(frozen=True, slots=True)
class Note:
    """A line for the producer's log, at ``level`` (``exc``: the exception whose traceback it shows)."""

    level: int
    message: str
    exc: BaseException | None = None


@dataclass(frozen=True, slots=True)
class Outcome:
    """What an event asks for: ``actions``, carried out in order under the producer's lock; ``wake``: what
    send() waits for changed (the session's welcome or error, the blocks granted), so whoever waits on the lock
    is woken; ``notes``, logged once the lock is released."""

    actions: tuple[Action, ...] = ()
    wake: bool = False
    notes: tuple[Note, ...] = ()


class Unreported(NamedTuple):
    """What the producer holds sealed and not reported: its batches, and their records."""

    batches: int
    records: int


class Session:
    """The session of one producer in one process with the daemon at ``endpoint``.

    ``welcome`` is the session's while attached; ``settings`` those of the last daemon that welcomed this
    client, which it works with between two daemons; ``error`` why no session can be had (send() raises it);
    ``sends_queued`` whether what the producer queued for the daemon goes now: while attached only (between
    sessions it waits for the next, to which it is then addressed).
    """

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.state = SessionState.IDLE
        # Read at every turn of the I/O thread's loop: a plain attribute, kept with the state by _enter().
        self.sends_queued = False
        self.welcome: ipc.Welcome | None = None
        self.settings: ipc.WelcomeSettings | None = None
        # Why the last daemon shut down (its SHUTDOWN), until another welcomes this client.
        self.shutdown_reason: str | None = None
        # Why the daemon last refused this client a session, until one is had.
        self.last_refusal: str | None = None
        self.error: KafkaError | None = None
        # The welcome of the session a daemon that is gone held (DRAINING, LOST), offered to the next one.
        self._lost_welcome: ipc.Welcome | None = None
        self._hello_id = 0  # the last HELLO's
        self._hello_said_at = 0.0  # when the last HELLO was said
        self._handshake: MakeHandshake | None = None  # the one being made

    # -- the I/O thread ------------------------------------------------------------------------------

    def start(self, now: float) -> Outcome:
        """The I/O thread starts: the first HELLO."""
        self._expect("start", SessionState.IDLE)
        self._enter(SessionState.AWAITING_WELCOME)
        return Outcome((self._hello(now),))

    def tick(self, now: float) -> Outcome:
        """The heartbeat's time: say that this client lives, or HELLO again if it went unanswered too long."""
        self._expect_started("a tick")
        if self.state in (SessionState.ATTACHED, SessionState.DRAINING):
            # While a daemon delivers this client's last batches too: silent, it would lose them.
            return Outcome((SendHeartbeat(),))
        waiting = self.state in (SessionState.AWAITING_WELCOME, SessionState.LOST)
        if waiting and now - self._hello_said_at > HELLO_RETRY_S:
            return Outcome((self._hello(now, reconnect=True),))
        return Outcome()

    def stop(self) -> Outcome:
        """The producer closes: GOODBYE, and nothing more."""
        self._expect_started("stop")
        self._end()
        return Outcome((SayGoodbye(),))

    def fail(self, error: KafkaError) -> None:
        """The I/O thread fails with ``error``: nothing will report this process's records any more."""
        self.error = error
        self._end()

    # -- the daemon's messages -----------------------------------------------------------------------

    def welcomed(self, welcome: ipc.Welcome) -> MakeHandshake | None:
        """A WELCOME: the memory handshake to make, unless it answers an earlier HELLO (said again since: its
        session ends with the next) or one answered already (attached, draining), or the session has ended."""
        self._expect_started("a WELCOME")
        if self.state not in (SessionState.AWAITING_WELCOME, SessionState.LOST) or welcome.hello_id != self._hello_id:
            return None
        # Beside this process's endpoint: where the daemon's socket is mounted here, not where the daemon is.
        path = shared_memory.memory_socket_path(self.endpoint, welcome.daemon_id)
        self._handshake = MakeHandshake(welcome, path, welcome.resumed and self._lost_welcome is not None)
        self._enter(SessionState.MEMORY_HANDSHAKE)
        return self._handshake

    def refused(self, error: ipc.Error, now: float) -> Outcome:
        """An ERROR: the daemon does not know this client, or refused its HELLO or a message."""
        self._expect_started("an ERROR")
        if error.code == ipc.ERROR_UNKNOWN_CLIENT:
            # The daemon restarted, or ended the session (it took this process for dead): start again. Before
            # a session, it answers what was sent before the HELLO.
            if self.state not in (SessionState.ATTACHED, SessionState.DRAINING):
                return Outcome()
            return self._lose(now, Note(logging.WARNING, "the kafka-sidecar daemon does not know this client any "
                                                         "more: connecting again"))
        if error.code == ipc.ERROR_SHUTTING_DOWN:
            # The HELLO is said again in a while, to the daemon that takes this one's place.
            return Outcome(notes=(Note(logging.INFO, f"kafka-sidecar at {self.endpoint}: {error.message}"),))
        if error.code == ipc.ERROR_VERSION:
            # The handshake itself: no session can be had with this daemon.
            return self._cannot_serve(SidecarUnavailableError(f"kafka-sidecar at {self.endpoint}: {error.message}"),
                                      Note(logging.ERROR, f"the kafka-sidecar daemon refused the handshake: "
                                                          f"{error.message}"))
        return Outcome(notes=(Note(logging.ERROR, f"the kafka-sidecar daemon refused a message: {error.message}"),))

    def mismatched(self, version: object) -> Outcome:
        """A handshake message of another protocol version."""
        self._expect_started("a message of another version")
        return self._cannot_serve(SidecarUnavailableError(
            f"kafka-sidecar at {self.endpoint} speaks protocol version {version!r}, this client "
            f"{PROTOCOL_VERSION}: upgrade kafka-sidecar on one side"))

    def shutting_down(self, reason: str) -> Outcome:
        """A SHUTDOWN: hand the daemon what this producer holds, as the session's last; it delivers or fails all
        of it before it goes. New records wait for the next daemon."""
        self._expect_started("a SHUTDOWN")
        if self.state is not SessionState.ATTACHED:
            return Outcome()
        self._lost_welcome, self.welcome = self.welcome, None
        self.shutdown_reason = reason
        self._enter(SessionState.DRAINING)
        return Outcome((HandOver(),), wake=True, notes=(Note(
            logging.INFO, f"the kafka-sidecar daemon at {self.endpoint} is shutting down ({reason}): handing it "
                          "the last batches; new records wait for the next daemon"),))

    def memory_hung_up(self, now: float) -> Outcome:
        """The daemon's memory connection hung up (after what it sent before was taken): it is gone."""
        self._expect_started("a hang-up")
        if self.state is SessionState.ENDED:
            return Outcome()
        return self._lose(now)

    # -- the memory handshake's outcome --------------------------------------------------------------

    def handshake_made(self, taken_back: Unreported | None) -> Outcome:
        """The handshake is made, with a new segment (``taken_back`` None: the lost session, if any, is
        forgotten first), or with the lost session's, taken back (``taken_back``: what it holds unreported)."""
        handshake = self._handshake_over("made")
        if (taken_back is not None) != handshake.resume:
            raise SessionProtocolError("the lost session is taken back by the handshake that offers it, and only so")
        lost, welcome = self._lost_welcome, handshake.welcome
        actions: tuple[Action, ...] = ()
        notes: tuple[Note, ...] = ()
        if taken_back is None:
            actions = () if lost is None else (Forget(),)
        elif lost is not None and lost.daemon_id == welcome.daemon_id:
            # It ended the session (this process was silent, or read too slowly) and kept what it had.
            notes = (Note(logging.WARNING, f"the kafka-sidecar daemon gave back the session it ended, with "
                                           f"{taken_back.batches} unreported batch(es) ({taken_back.records} "
                                           "record(s))"),)
        else:
            notes = (Note(logging.WARNING, f"the kafka-sidecar daemon took back {taken_back.batches} unreported "
                                           f"batch(es) of the lost session ({taken_back.records} record(s), sent "
                                           "again)"),)
        self._lost_welcome = None
        self.shutdown_reason = None
        self.last_refusal = None
        self.welcome = welcome
        self.settings = welcome.settings
        self._enter(SessionState.ATTACHED)
        return Outcome(actions, wake=True, notes=notes)

    def handshake_failed(self, exc: Exception, now: float) -> Outcome:
        """The handshake failed: refused (HandshakeError), forbidden (PermissionError), the daemon out of reach
        (another OSError), or what it handed over is not what it said (a token or a segment that will not do):
        whatever it got of it is closed."""
        handshake = self._handshake_over("failed")
        if isinstance(exc, shared_memory.HandshakeError) and handshake.resume:
            self._lost_welcome = None
            self._enter(SessionState.AWAITING_WELCOME)
            return Outcome((Forget(), self._hello(now)), notes=(Note(
                logging.ERROR, f"the kafka-sidecar daemon did not take the lost session back: {exc}"),))
        self._enter(SessionState.LOST if self._lost_welcome is not None else SessionState.AWAITING_WELCOME)
        if isinstance(exc, shared_memory.HandshakeError):
            if str(exc).endswith(shared_memory.UNKNOWN_TOKEN):
                # An older welcome, whose token the daemon forgot when a HELLO said again replaced it.
                return Outcome(notes=(Note(logging.DEBUG, f"memory handshake refused: {exc}"),))
            # Refused for a reason (this process has as many sessions as it may, or the daemon cannot see it):
            # said again in a while, and what send() says if no session comes of it.
            self.last_refusal = str(exc)
            return Outcome(notes=(Note(logging.WARNING, f"kafka-sidecar at {self.endpoint}: {exc}"),))
        if isinstance(exc, PermissionError):
            # Say why, rather than letting send() time out waiting for a session that cannot work.
            return self._cannot_serve(SidecarUnavailableError(
                f"cannot get shared memory from the kafka-sidecar daemon at {self.endpoint} ({handshake.path}): "
                f"{exc}; is this user in the daemon's group?"))
        if isinstance(exc, OSError):
            # The daemon went between its welcome and the handshake: the HELLO is said again in a while.
            return Outcome(notes=(Note(logging.WARNING, f"cannot reach the memory socket of the kafka-sidecar "
                                                        f"daemon at {self.endpoint}: {exc}"),))
        # A WELCOME whose fields are not of their kind, a segment that cannot be mapped: a daemon's bug, or this
        # client's. Not this session's end: the HELLO is said again in a while, as after any failed handshake.
        return Outcome(notes=(Note(logging.ERROR, f"the memory handshake with the kafka-sidecar daemon at "
                                                  f"{self.endpoint} failed ({type(exc).__name__}: {exc}): saying "
                                                  "HELLO again in a while", exc),))

    # -- transitions ---------------------------------------------------------------------------------

    def _enter(self, state: SessionState) -> None:
        self.state = state
        self.sends_queued = state is SessionState.ATTACHED

    def _hello(self, now: float, *, reconnect: bool = False) -> SayHello:
        self._hello_id += 1
        self._hello_said_at = now
        return SayHello(self._hello_id, self._lost_welcome, reconnect)

    def _lose(self, now: float, *notes: Note) -> Outcome:
        """Keep what the session held (its segment, its sealed batches) for the next daemon, which HELLO
        offers it to."""
        actions: list[Action] = []
        attached = self.state is SessionState.ATTACHED
        if attached:
            notes += (Note(logging.WARNING, f"lost the session with the kafka-sidecar daemon at {self.endpoint}: "
                                            "connecting again"),)
            self._lost_welcome, self.welcome = self.welcome, None
            actions.append(Detach())
        actions.append(HoldMemory())
        if self.error is not None:
            # It could not be had again: send() raises the error.
            self._enter(SessionState.ENDED)
        else:
            self._enter(SessionState.LOST if self._lost_welcome is not None else SessionState.AWAITING_WELCOME)
            actions.append(self._hello(now))
        # A send() waiting for blocks of the session looks again, and waits for the next.
        return Outcome(tuple(actions), wake=attached, notes=notes)

    def _cannot_serve(self, error: KafkaError, *notes: Note) -> Outcome:
        """No daemon can serve this client: the session ends, unless it holds one (whose batches it goes on
        reporting until it is lost)."""
        self.error = error
        if self.state not in (SessionState.ATTACHED, SessionState.DRAINING):
            self._end()
        return Outcome(wake=True, notes=notes)

    def _end(self) -> None:
        self.welcome = None
        self._handshake = None
        self._enter(SessionState.ENDED)

    def _handshake_over(self, outcome: str) -> MakeHandshake:
        self._expect(f"a handshake {outcome}", SessionState.MEMORY_HANDSHAKE)
        handshake = self._handshake
        assert handshake is not None, "welcomed() makes it"
        self._handshake = None
        return handshake

    def _expect(self, event: str, state: SessionState) -> None:
        if self.state is not state:
            raise SessionProtocolError(f"{event} in state {self.state.name}, which takes it in {state.name} only")

    def _expect_started(self, event: str) -> None:
        # The I/O thread starts the session before it polls, and makes a handshake before it takes anything else.
        if self.state in (SessionState.IDLE, SessionState.MEMORY_HANDSHAKE):
            raise SessionProtocolError(f"{event} in state {self.state.name}")
