"""A TLS- and SASL-terminating Kafka proxy of the tests, in front of a plaintext broker.

The embedded broker (Tansu 0.6) cannot serve TLS here (its CLI refuses ``--cert`` with ``--key``)
and its SASL users cannot be made (``tansu user create`` speaks no SASL, so an authenticating
broker cuts it off, and its memory storage does not outlive a restart without authentication).
``SecureProxy`` plays a Kafka broker's security layer instead: one listener, SSL, SASL_PLAINTEXT
or SASL_SSL, with the mechanisms PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512 (scramp's server side),
and the behaviour of Apache Kafka's SaslServerAuthenticator where a client can see it:

- before authentication only ApiVersions (forwarded to the broker), SaslHandshake v1 and then
  SaslAuthenticate are served; any other request closes the connection, unanswered;
- an unknown mechanism gets UNSUPPORTED_SASL_MECHANISM (33) with the enabled ones, then a close;
- a wrong password or an unknown user gets SASL_AUTHENTICATION_FAILED (58) with Kafka's message
  (:func:`authentication_failed_message`), then a close;
- with a session lifetime (KIP-368) SaslAuthenticate v1+ tells it to the client, a SaslHandshake
  on an authenticated connection starts a re-authentication (counted per connection, see
  :attr:`SecureProxy.sessions`), and a request other than SaslHandshake that arrives after the
  session expired closes the connection, as a Kafka broker does.

Once authenticated, request and response frames pass unchanged; the proxy keeps splitting them
(one copy each) to answer a re-authentication in its place among the broker's responses. Tansu
advertises SaslHandshake v0-1 and SaslAuthenticate v0-2 itself, so ApiVersions is not rewritten.
TLS (``ServerTls``) can require client certificates and limit the versions served.

``SecureBroker`` starts Tansu behind a proxy (and optionally a FaultProxy, on either side of it)
with the front door as the broker's advertised address::

    certs = make_certificates(tmp_path)
    listener = Listener("SASL_SSL", tls=ServerTls(certs.server.certificate, certs.server.key),
                        mechanisms=("SCRAM-SHA-512",), users={"alice": "alice-secret"})
    with SecureBroker(listener) as kafka:
        kafka.create_topic("t", 3)
        config = librdkafka_settings(kafka.bootstrap, "SASL_SSL", ca_location=certs.ca,
                                     mechanism="SCRAM-SHA-512", username="alice", password="alice-secret")
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ssl
import threading
import time
from collections import deque
from collections.abc import Coroutine, Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self

import scramp

from service.protocol import messages as m
from service.protocol import primitives as prim
from service.protocol.api import peek_correlation_id
from service.protocol.framing import SIZE
from service.protocol.schema import Message
from service.tools.embedded import EmbeddedBroker, free_port
from tests.support.broker_codec import decode_request, encode_response, peek_request_header
from tests.support.proxy import FaultProxy

SecurityProtocol = Literal["SSL", "SASL_PLAINTEXT", "SASL_SSL"]
FaultPlacement = Literal["client-side", "broker-side"]

MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
UNSUPPORTED_SASL_MECHANISM = 33
ILLEGAL_SASL_STATE = 34
SASL_AUTHENTICATION_FAILED = 58
PLAIN_FAILED_MESSAGE = "Authentication failed: Invalid username or password"
# SessionInfo.closed when a side closed (or reset) its connection.
CLIENT_GONE = "client closed the connection"
BROKER_GONE = "broker closed the connection"

# Kafka's minimum iteration count: the clients' PBKDF2 stays quick.
SCRAM_ITERATIONS = 4096
# socket.request.max.bytes's default: a larger size prefix is not a Kafka stream.
_MAX_FRAME = 100 * 1024 * 1024
_STREAM_LIMIT = 1024 * 1024  # StreamReader's buffer: large frames in fewer wake-ups
_HANDSHAKE_TIMEOUT = 10.0
_CALL_TIMEOUT = 10.0


def authentication_failed_message(mechanism: str, *, reauthentication: bool = False) -> str:
    """Kafka's SaslAuthenticate error message for a wrong password or an unknown user with ``mechanism``.

    PLAIN's server says it in its own words; for the others Kafka hides the cause behind the message
    it gives any SASL exchange that fails (:func:`_sasl_failed_message`).
    """
    return PLAIN_FAILED_MESSAGE if mechanism == "PLAIN" else _sasl_failed_message(mechanism, reauthentication)


def _sasl_failed_message(mechanism: str, reauthentication: bool = False) -> str:
    stage = "re-authentication" if reauthentication else "authentication"
    return f"Authentication failed during {stage} due to invalid credentials with SASL mechanism {mechanism}"


@dataclass(frozen=True)
class ServerTls:
    """The proxy's side of TLS: its certificate chain and key (PEM), and whether clients need one."""

    certificate: Path
    key: Path
    key_password: str | None = None
    client_ca: Path | None = None  # when set, a client must present a certificate this CA signed
    # The TLS versions served (ssl.enabled.protocols' other side); None: Python's defaults (1.2 and 1.3).
    minimum_version: ssl.TLSVersion | None = None
    maximum_version: ssl.TLSVersion | None = None

    def context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.certificate, self.key, self.key_password)
        if self.minimum_version is not None:
            context.minimum_version = self.minimum_version
        if self.maximum_version is not None:
            context.maximum_version = self.maximum_version
        if self.client_ca is not None:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(self.client_ca)
        return context


@dataclass(frozen=True)
class Listener:
    """What the proxy's one listener requires of clients."""

    security_protocol: SecurityProtocol
    tls: ServerTls | None = None
    mechanisms: tuple[str, ...] = ()
    users: Mapping[str, str] = field(default_factory=dict)
    session_lifetime_ms: int | None = None  # KIP-368; None: sessions never expire

    def __post_init__(self) -> None:
        uses_tls = self.security_protocol in ("SSL", "SASL_SSL")
        if uses_tls != (self.tls is not None):
            raise ValueError(f"{self.security_protocol} {'needs' if uses_tls else 'takes no'} ServerTls")
        if self.sasl != bool(self.mechanisms):
            raise ValueError(f"{self.security_protocol} {'needs' if self.sasl else 'takes no'} SASL mechanisms")
        unknown = set(self.mechanisms) - set(MECHANISMS)
        if unknown:
            raise ValueError(f"unknown SASL mechanisms {sorted(unknown)}; known: {MECHANISMS}")
        if self.session_lifetime_ms is not None and (not self.sasl or self.session_lifetime_ms <= 0):
            raise ValueError("a session lifetime needs SASL and a positive number of milliseconds")

    @property
    def sasl(self) -> bool:
        return self.security_protocol.startswith("SASL_")


@dataclass
class SessionInfo:
    """What the proxy saw of one client connection (``SecureProxy.sessions`` gives copies)."""

    peer_port: int
    user: str | None = None  # once authenticated
    mechanism: str | None = None
    reauthentications: int = 0  # successful ones, after the first authentication
    closed: str | None = None  # why the connection ended; None while it is open


class SecureProxy:
    """A Kafka broker's TLS and SASL in front of the plaintext broker at ``target_host:target_port``.

    Serves on 127.0.0.1 (a free port) from an asyncio loop in one background thread; every
    connection opens its own connection to the target. Thread-safe; a context manager.
    """

    def __init__(self, listener: Listener, target_host: str, target_port: int, *, host: str = "127.0.0.1") -> None:
        self.listener = listener
        self.target = (target_host, target_port)
        self.host = host
        self.port = 0
        self._tls = listener.tls.context() if listener.tls is not None else None
        # scramp's (salt, stored key, server key, iterations) by mechanism and user, made once: each
        # costs SCRAM_ITERATIONS rounds of PBKDF2.
        self.scram_credentials = {
            mechanism: {user: scramp.ScramMechanism(mechanism).make_auth_info(password, SCRAM_ITERATIONS)
                        for user, password in listener.users.items()}
            for mechanism in listener.mechanisms if mechanism.startswith("SCRAM-")
        }
        self._lock = threading.Lock()
        self._sessions: list[SessionInfo] = []
        self._failures: list[BaseException] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def address(self) -> str:
        """``host:port`` of the listener."""
        return f"{self.host}:{self.port}"

    @property
    def sessions(self) -> list[SessionInfo]:
        """Every client connection accepted since start, oldest first (copies)."""
        with self._lock:
            return [dataclasses.replace(info) for info in self._sessions]

    def start(self) -> None:
        """Listen on a free port and serve from a new background thread."""
        if self._thread is not None:
            raise RuntimeError("SecureProxy already started")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="SecureProxy", daemon=True)
        self._thread.start()
        try:
            self._run(self._listen())
        except BaseException:
            self.stop()
            raise
        self._thread.name = f"SecureProxy-{self.port}"

    def stop(self) -> None:
        """Close the listener and every connection, and join the thread.

        Raises RuntimeError if a connection's handling failed with an unexpected exception.
        """
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        try:
            self._run(self._shut_down())
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(_CALL_TIMEOUT)
            self._loop = self._thread = None
            if not thread.is_alive():
                loop.close()
        if thread.is_alive():
            raise RuntimeError(f"{thread.name} did not stop")
        if self._failures:
            raise RuntimeError(f"{thread.name} failed: {self._failures!r}") from self._failures[0]

    def _run(self, coroutine: Coroutine[Any, Any, None]) -> None:
        assert self._loop is not None
        asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(_CALL_TIMEOUT)

    # The loop thread from here on.

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._serve, self.host, 0, limit=_STREAM_LIMIT)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _shut_down(self) -> None:
        if self._server is not None:
            self._server.close()
        await asyncio.sleep(0)  # connections accepted last start their tasks, and register them
        while self._tasks:  # a task leaves the set once its connection is closed
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One client connection, from accept to close."""
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        info = SessionInfo(peer_port=writer.get_extra_info("peername")[1])
        with self._lock:
            self._sessions.append(info)
        upstream: asyncio.StreamWriter | None = None
        cut = False
        try:
            if self._tls is not None:
                try:
                    await writer.start_tls(self._tls, ssl_handshake_timeout=_HANDSHAKE_TIMEOUT)
                except (OSError, TimeoutError) as exc:  # ssl.SSLError is an OSError
                    self._set(info, closed=f"TLS handshake failed: {exc or repr(exc)}")
                    return
            try:
                upstream_reader, upstream = await asyncio.open_connection(*self.target, limit=_STREAM_LIMIT)
            except OSError as exc:
                self._set(info, closed=f"broker unreachable: {exc}")
                return
            connection = _Connection(self, info, reader, writer, upstream_reader, upstream)
            reason = await connection.run()
            # The broker's close reaches the client as a cut, not as an orderly TLS shutdown.
            cut = reason == BROKER_GONE
            self._set(info, closed=reason)
        except asyncio.CancelledError:
            self._set(info, closed="proxy stopped")
        except Exception as exc:
            self._failures.append(exc)
            self._set(info, closed=f"proxy failed: {exc!r}")
        finally:
            if upstream is not None:
                upstream.transport.abort()
            try:
                await _close(writer, abort=cut)
            finally:
                self._tasks.discard(task)

    def _set(self, info: SessionInfo, **changes: Any) -> None:
        with self._lock:
            for name, value in changes.items():
                setattr(info, name, value)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


class _Slot:
    """A response owed to the client, in request order: the broker's (filled when it comes) or ours."""

    __slots__ = ("data", "correlation_id", "close_reason")

    def __init__(self, data: bytes | None = None, *, correlation_id: int | None = None,
                 close_reason: str | None = None) -> None:
        self.data = data
        self.correlation_id = correlation_id  # of a request forwarded to the broker; None: ours
        self.close_reason = close_reason  # close the connection once this response is written


class _Connection:
    """The two directions of one proxied connection and its SASL state."""

    def __init__(self, proxy: SecureProxy, info: SessionInfo, client_reader: asyncio.StreamReader,
                 client: asyncio.StreamWriter, broker_reader: asyncio.StreamReader,
                 broker: asyncio.StreamWriter) -> None:
        self.proxy = proxy
        self.listener = proxy.listener
        self.info = info
        self.client_reader, self.client = client_reader, client
        self.broker_reader, self.broker = broker_reader, broker
        self.done: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        # Responses owed, in request order (Kafka answers a connection's requests in order), and the
        # broker's among them by correlation id.
        self.slots: deque[_Slot] = deque()
        self.expected: dict[int, _Slot] = {}
        self.stopped_reading = False
        # SASL: "handshake" (ApiVersions or SaslHandshake expected), "authenticate" (SaslAuthenticate
        # expected), "authenticated". A listener without SASL starts authenticated.
        self.state = "handshake" if self.listener.sasl else "authenticated"
        self.reauthenticating = False
        self.mechanism: str | None = None  # chosen by the last SaslHandshake
        self.scram: Any = None  # scramp's ScramServer during a SCRAM exchange
        self.scram_user: str | None = None
        self.expires: float | None = None  # monotonic time the session ends

    async def run(self) -> str:
        """Serve until either side closes or the proxy closes; returns why."""
        tasks = [asyncio.create_task(self._guard(self._from_client())),
                 asyncio.create_task(self._guard(self._from_broker()))]
        try:
            return await self.done
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _guard(self, loop: Coroutine[Any, Any, None]) -> None:
        """Run one direction; its end or failure ends the connection (bugs reach stop())."""
        try:
            await loop
        except _Gone as gone:
            self._finish(gone.reason)
        except prim.ProtocolError as exc:
            self._finish(f"protocol error: {exc}")
        except Exception as exc:
            if not self.done.done():
                self.done.set_exception(exc)

    def _finish(self, reason: str) -> None:
        if not self.done.done():
            self.done.set_result(reason)

    async def _from_client(self) -> None:
        while not self.stopped_reading:
            frame = await _read_frame(self.client_reader, CLIENT_GONE)
            api_key, version, correlation_id = peek_request_header(frame, SIZE.size)
            if self.state == "authenticated" and not (api_key == m.SASL_HANDSHAKE and self.listener.sasl):
                if self.expires is not None and time.monotonic() >= self.expires:
                    self._finish("session expired")
                    return
                if api_key in (m.SASL_HANDSHAKE, m.SASL_AUTHENTICATE):
                    # Kafka's KafkaApis answers these on an authenticated connection (or a listener
                    # without SASL) with ILLEGAL_SASL_STATE.
                    self._respond(_illegal_sasl_state(api_key), version, correlation_id)
                else:
                    await self._forward(frame, correlation_id)
            elif api_key == m.API_VERSIONS and self.state == "handshake":
                await self._forward(frame, correlation_id)
            elif api_key == m.SASL_HANDSHAKE and self.state in ("handshake", "authenticated"):
                self._handshake(frame, version, correlation_id)
            elif api_key == m.SASL_AUTHENTICATE and self.state == "authenticate":
                self._authenticate(frame, version, correlation_id)
            else:
                # Kafka's IllegalSaslStateException: the connection closes, the request unanswered.
                self._finish(f"request {api_key} v{version} during SASL authentication")
                return
            await _drain(self.client, CLIENT_GONE)

    async def _from_broker(self) -> None:
        while True:
            frame = await _read_frame(self.broker_reader, BROKER_GONE)
            correlation_id = peek_correlation_id(frame, SIZE.size)
            slot = self.expected.pop(correlation_id, None)
            if slot is None:
                raise prim.ProtocolError(f"the broker answered correlation id {correlation_id}, not asked")
            # A broker answers in order: what it left unanswered before this request, it never answers
            # (Produce with acks=0 at a Kafka broker; Tansu answers those too, and they pass). An answer
            # of ours queued right behind such a request waits for the broker's next answer.
            for earlier in self.slots:
                if earlier is slot:
                    break
                if earlier.data is None and earlier.correlation_id is not None:
                    del self.expected[earlier.correlation_id]
                    earlier.data = b""
            slot.data = frame
            self._flush()
            await _drain(self.client, CLIENT_GONE)

    async def _forward(self, frame: bytes, correlation_id: int) -> None:
        slot = _Slot(correlation_id=correlation_id)
        self.expected[correlation_id] = slot
        self.slots.append(slot)
        self.broker.write(frame)
        await _drain(self.broker, BROKER_GONE)

    def _respond(self, body: Message, version: int, correlation_id: int, close_reason: str | None = None) -> None:
        """Answer in the broker's place, after the broker's answers to earlier requests."""
        self.slots.append(_Slot(encode_response(body, version, correlation_id), close_reason=close_reason))
        if close_reason is not None:
            self.stopped_reading = True
        self._flush()

    def _flush(self) -> None:
        """Write the responses that are ready and next in order."""
        while self.slots and self.slots[0].data is not None:
            slot = self.slots.popleft()
            assert slot.data is not None
            self.client.write(slot.data)
            if slot.close_reason is not None:
                self._finish(slot.close_reason)
                return

    def _handshake(self, frame: bytes, version: int, correlation_id: int) -> None:
        _, request = decode_request(memoryview(frame)[SIZE.size:])
        enabled = list(self.listener.mechanisms)
        if version == 0:
            # v0 is followed by bare SASL tokens, not SaslAuthenticate: Kafka 4 removed it.
            self._finish("SaslHandshake v0")
            return
        mechanism = request.mechanism
        if mechanism not in enabled:
            self._respond(m.SaslHandshakeResponse(error_code=UNSUPPORTED_SASL_MECHANISM, mechanisms=enabled),
                          version, correlation_id, close_reason=f"unsupported SASL mechanism {mechanism}")
            return
        if self.state == "authenticated":
            if mechanism != self.mechanism:
                self._finish(f"SASL mechanism changed from {self.mechanism} to {mechanism} on re-authentication")
                return
            self.reauthenticating = True
        self.mechanism = mechanism
        self.state = "authenticate"
        if mechanism.startswith("SCRAM-"):
            self.scram = scramp.ScramMechanism(mechanism).make_server(self._scram_lookup)
            self.scram_user = None
        self._respond(m.SaslHandshakeResponse(error_code=0, mechanisms=enabled), version, correlation_id)

    def _authenticate(self, frame: bytes, version: int, correlation_id: int) -> None:
        _, request = decode_request(memoryview(frame)[SIZE.size:])
        assert self.mechanism is not None
        token: bytes = request.auth_bytes or b""
        if self.mechanism == "PLAIN":
            try:
                user = _check_plain(token, self.listener.users)
            except _Refused as refused:
                self._fail(str(refused), version, correlation_id)
            else:
                self._authenticated(user, b"", version, correlation_id)
            return
        try:
            if self.scram_user is None:
                self.scram.set_client_first(token.decode())
                server_first = self.scram.get_server_first().encode()
                self._respond(m.SaslAuthenticateResponse(error_code=0, auth_bytes=server_first, session_lifetime_ms=0),
                              version, correlation_id)
                return
            self.scram.set_client_final(token.decode())
            server_final = self.scram.get_server_final().encode()
        except Exception:
            # scramp (a wrong proof, a malformed message), our lookup (an unknown user), or UTF-8:
            # Kafka tells the client nothing more than this.
            self._fail(authentication_failed_message(self.mechanism, reauthentication=self.reauthenticating),
                       version, correlation_id)
            return
        user = self.scram_user
        self.scram, self.scram_user = None, None
        self._authenticated(user, server_final, version, correlation_id)

    def _scram_lookup(self, user: str) -> tuple[bytes, bytes, bytes, int]:
        """scramp's lookup: (salt, stored key, server key, iterations); KeyError for an unknown user."""
        assert self.mechanism is not None
        credentials = self.proxy.scram_credentials[self.mechanism][user]
        self.scram_user = user
        return credentials

    def _authenticated(self, user: str, token: bytes, version: int, correlation_id: int) -> None:
        if self.reauthenticating and user != self.info.user:
            self._fail(f"Cannot change principals during re-authentication from User.{self.info.user}: User.{user}",
                       version, correlation_id)
            return
        lifetime = self.listener.session_lifetime_ms
        self.expires = None if lifetime is None else time.monotonic() + lifetime / 1000
        self.proxy._set(self.info, user=user, mechanism=self.mechanism,
                        reauthentications=self.info.reauthentications + int(self.reauthenticating))
        self.state, self.reauthenticating = "authenticated", False
        self._respond(m.SaslAuthenticateResponse(error_code=0, auth_bytes=token, session_lifetime_ms=lifetime or 0),
                      version, correlation_id)

    def _fail(self, message: str, version: int, correlation_id: int) -> None:
        self._respond(m.SaslAuthenticateResponse(error_code=SASL_AUTHENTICATION_FAILED, error_message=message,
                                                 auth_bytes=b"", session_lifetime_ms=0),
                      version, correlation_id, close_reason=f"authentication failed: {message}")


class _Refused(Exception):
    """A SASL exchange failed; the message is what Kafka tells the client."""


def _check_plain(token: bytes, users: Mapping[str, str]) -> str:
    """The user whose PLAIN credentials (RFC 4616: authzid NUL user NUL password) these are; else _Refused."""
    parts = token.split(b"\0")
    if len(parts) != 3:
        raise _Refused(_sasl_failed_message("PLAIN"))
    authzid, user, password = (part.decode(errors="replace") for part in parts)
    if authzid and authzid != user:
        raise _Refused("Authentication failed: Client requested an authorization id that is different from username")
    if users.get(user) != password:
        raise _Refused(PLAIN_FAILED_MESSAGE)
    return user


def _illegal_sasl_state(api_key: int) -> Message:
    if api_key == m.SASL_HANDSHAKE:
        return m.SaslHandshakeResponse(error_code=ILLEGAL_SASL_STATE, mechanisms=[])
    return m.SaslAuthenticateResponse(error_code=ILLEGAL_SASL_STATE, auth_bytes=b"", session_lifetime_ms=0,
                                      error_message="SaslAuthenticate request received after successful authentication")


class _Gone(Exception):
    """One side of a connection closed it (an end of stream, a reset, a failed write)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


async def _read_frame(reader: asyncio.StreamReader, gone: str) -> bytes:
    """One size-prefixed frame, prefix included; _Gone(``gone``) if the stream ends or fails."""
    try:
        prefix = await reader.readexactly(SIZE.size)
        (size,) = SIZE.unpack(prefix)
        if not 0 <= size <= _MAX_FRAME:
            raise prim.ProtocolError(f"frame size {size} is not Kafka's")
        return prefix + await reader.readexactly(size)
    except (asyncio.IncompleteReadError, OSError) as exc:  # ssl.SSLError is an OSError
        raise _Gone(gone) from exc


async def _drain(writer: asyncio.StreamWriter, gone: str) -> None:
    """Wait until ``writer`` takes more; _Gone(``gone``) if its connection was lost meanwhile."""
    try:
        await writer.drain()
    except OSError as exc:
        raise _Gone(gone) from exc


async def _close(writer: asyncio.StreamWriter, *, abort: bool) -> None:
    """Close a connection: an abort drops what is unsent; otherwise it goes first (bounded)."""
    if abort:
        writer.transport.abort()
        return
    writer.close()
    with contextlib.suppress(OSError, TimeoutError):
        await asyncio.wait_for(writer.wait_closed(), 1.0)
    writer.transport.abort()  # a no-op if closed; frees a transport the peer never let finish


class SecureBroker:
    """Tansu behind a SecureProxy, advertising the front door: the proxy, or a FaultProxy.

    ``fault_proxy="client-side"`` puts a FaultProxy in front of the proxy (clients -> FaultProxy ->
    SecureProxy -> Tansu): it cuts client connections as they are on the wire, but it splits what it
    forwards into Kafka frames, so it serves SASL_PLAINTEXT only (over TLS it would wait for a frame
    size read from TLS bytes: refused). ``"broker-side"`` puts it between the proxy and Tansu (clients ->
    SecureProxy -> FaultProxy -> Tansu), where it sees plaintext Kafka whatever the listener: every
    fault works, and a connection it cuts is cut (a TCP reset) on the client's side by the proxy.
    """

    def __init__(self, listener: Listener, *, fault_proxy: FaultPlacement | None = None) -> None:
        if fault_proxy == "client-side" and listener.tls is not None:
            raise ValueError("a FaultProxy reads Kafka frames and cannot pass TLS: put it broker-side")
        self.listener = listener
        self.fault_placement = fault_proxy
        self._stack = ExitStack()
        self.broker: EmbeddedBroker
        self.proxy: SecureProxy
        self.fault: FaultProxy | None = None
        self._front_port = 0

    @property
    def bootstrap(self) -> str:
        """Where clients connect: the address the broker advertises."""
        return f"127.0.0.1:{self._front_port}"

    def start(self) -> None:
        with ExitStack() as stack:
            broker_port = free_port()
            target = broker_port
            if self.fault_placement == "broker-side":
                self.fault = stack.enter_context(FaultProxy("127.0.0.1", broker_port))
                target = self.fault.port
            self.proxy = stack.enter_context(SecureProxy(self.listener, "127.0.0.1", target))
            self._front_port = self.proxy.port
            if self.fault_placement == "client-side":
                self.fault = stack.enter_context(FaultProxy("127.0.0.1", self.proxy.port))
                self._front_port = self.fault.port
            self.broker = stack.enter_context(EmbeddedBroker(port=broker_port, advertised_port=self._front_port))
            self._stack = stack.pop_all()

    def stop(self) -> None:
        """Stop the broker, then the proxies (raising what their threads failed with)."""
        self._stack.close()

    def create_topic(self, name: str, partitions: int) -> None:
        """Create ``name`` with Tansu's CLI, straight to the broker's own port."""
        self.broker.create_topic(name, partitions)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def librdkafka_settings(bootstrap: str, security_protocol: SecurityProtocol | Literal["PLAINTEXT"], *,
                        ca_location: Path | None = None, mechanism: str | None = None,
                        username: str | None = None, password: str | None = None,
                        certificate: Path | None = None, key: Path | None = None,
                        key_password: str | None = None) -> dict[str, str]:
    """A librdkafka (confluent-kafka) configuration for these security settings, as its users write it."""
    settings = {"bootstrap.servers": bootstrap, "security.protocol": security_protocol}
    optional: dict[str, object | None] = {
        "ssl.ca.location": ca_location, "sasl.mechanism": mechanism, "sasl.username": username,
        "sasl.password": password, "ssl.certificate.location": certificate, "ssl.key.location": key,
        "ssl.key.password": key_password,
    }
    settings.update({name: str(value) for name, value in optional.items() if value is not None})
    if security_protocol.endswith("SSL"):
        settings["ssl.endpoint.identification.algorithm"] = "https"  # librdkafka's default; said aloud
    return settings

