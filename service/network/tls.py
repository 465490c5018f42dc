"""TLS to the brokers within the Selector's non-blocking model, as Java's SslTransportLayer.

:class:`TlsTransport` keeps TLS sans-IO: an ``ssl.SSLObject`` between two
``ssl.MemoryBIO``; the transport moves bytes between them and the non-blocking
socket, so the handshake, partial reads and partial writes never block the event
loop. Ciphertext the socket would not take waits in the transport, which the
Selector flushes (:meth:`TlsTransport.flush`) before a send counts as done.
Records are copied once here (into the TLS library), where PLAINTEXT sends them
from the clients' copies with ``sendmsg``.

:func:`ssl_context` builds the client context from Kafka's ssl.* settings, in PEM.
"""

from __future__ import annotations

import os
import socket
import ssl
import tempfile
from pathlib import Path

from client_stub.contract.records import Buffer
from client_stub.errors import ConfigError, SslAuthenticationError

from ..config import TLS_VERSIONS, ProducerConfig
from .transport import WANT_READ, WANT_WRITE

# Plaintext handed to the TLS library at once: it cuts it into records of 16 KiB.
_WRITE_CHUNK = 256 * 1024
_READ_CHUNK = 256 * 1024
_WOULD_BLOCK = (BlockingIOError, InterruptedError)
# OpenSSL's X509_V_ERR_HOSTNAME_MISMATCH, _EMAIL_MISMATCH and _IP_ADDRESS_MISMATCH.
_NAME_MISMATCHES = (62, 63, 64)


def ssl_context(config: ProducerConfig) -> ssl.SSLContext:
    """The TLS client context of the ssl.* settings; ConfigError, naming the setting, for a certificate or key
    that cannot be read or used."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    versions = [TLS_VERSIONS[name] for name in config["ssl.enabled.protocols"]]
    context.minimum_version, context.maximum_version = min(versions), max(versions)
    context.check_hostname = config["ssl.endpoint.identification.algorithm"] == "https"
    context.verify_mode = ssl.CERT_REQUIRED
    try:
        if config["ssl.truststore.location"]:
            context.load_verify_locations(cafile=config["ssl.truststore.location"])
        elif config["ssl.truststore.certificates"]:
            context.load_verify_locations(cadata=config["ssl.truststore.certificates"])
        else:
            context.load_default_certs()
    except (OSError, ssl.SSLError) as exc:
        setting = "ssl.truststore.location" if config["ssl.truststore.location"] else "ssl.truststore.certificates"
        raise ConfigError(f"{setting}: no CA certificates in PEM could be read ({_reason(exc)})") from None
    password = config["ssl.key.password"] or None
    try:
        if config["ssl.keystore.location"]:
            context.load_cert_chain(config["ssl.keystore.location"], password=password)
        elif config["ssl.keystore.key"]:
            _load_inline_chain(context, config["ssl.keystore.certificate.chain"], config["ssl.keystore.key"],
                               password)
    except (OSError, ssl.SSLError) as exc:
        setting = "ssl.keystore.location" if config["ssl.keystore.location"] else "ssl.keystore.key"
        raise ConfigError(f"{setting}: the private key and certificate chain in PEM could not be used "
                          f"({_reason(exc)}; a wrong ssl.key.password says so too)") from None
    return context


def _load_inline_chain(context: ssl.SSLContext, chain: str, key: str, password: str | None) -> None:
    # The ssl module loads a key and chain from files only: private ones, gone once read.
    with tempfile.TemporaryDirectory(prefix="kafka-sidecar-keystore-") as directory:
        chain_path, key_path = Path(directory) / "chain.pem", Path(directory) / "key.pem"
        for path, text in ((chain_path, chain), (key_path, key)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as file:
                file.write(text)
        context.load_cert_chain(chain_path, key_path, password=password)


def _reason(exc: BaseException) -> str:
    return str(getattr(exc, "reason", None) or getattr(exc, "strerror", None) or exc)


class TlsTransport:
    """A TLS client connection over a non-blocking socket (see the module's docstring)."""

    def __init__(self, sock: socket.socket, context: ssl.SSLContext, server_hostname: str) -> None:
        self.sock = sock
        self._host = server_hostname
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._tls = context.wrap_bio(self._incoming, self._outgoing, server_hostname=server_hostname)
        # Ciphertext the socket has not taken yet.
        self._pending = memoryview(b"")
        self._eof = False

    def handshake(self) -> int:
        self._read_socket()
        try:
            self._tls.do_handshake()
        except ssl.SSLWantReadError:
            if self._eof:
                raise ConnectionError("the broker closed the connection during the TLS handshake") from None
            return WANT_READ | (0 if self.flush() else WANT_WRITE)
        except ssl.SSLCertVerificationError as exc:
            what = f"is not for {self._host}" if exc.verify_code in _NAME_MISMATCHES else "is not trusted"
            raise SslAuthenticationError(f"TLS handshake with {self._host} failed: the broker's certificate {what} "
                                         f"({exc.verify_message}; ssl.truststore.*, "
                                         "ssl.endpoint.identification.algorithm)") from None
        except ssl.SSLError as exc:
            raise SslAuthenticationError(f"TLS handshake with {self._host} failed: {_reason(exc)}") from None
        return 0 if self.flush() else WANT_WRITE

    def send(self, buffers: list[Buffer]) -> int:
        if not self.flush():
            raise BlockingIOError
        # The first buffer, or its first chunk: sent whole or waiting in _pending, it counts as written.
        written = self._tls.write(memoryview(buffers[0])[:_WRITE_CHUNK])
        self.flush()
        return written

    def recv(self, size: int) -> bytes:
        self._read_socket()
        parts: list[bytes] = []
        total = 0
        # All the plaintext up to size: the Selector reads again only while a whole chunk came, and what the TLS
        # library holds wakes no poll.
        while total < size:
            try:
                part = self._tls.read(size - total)
            except ssl.SSLWantReadError:
                break
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                self._eof = True
                break
            if not part:
                break
            parts.append(part)
            total += len(part)
        self.flush()  # what the reads had to answer (a TLS 1.3 key update, an alert)
        if parts:
            return b"".join(parts)
        if self._eof:
            return b""
        raise BlockingIOError

    def flush(self) -> bool:
        """Hand the socket the ciphertext waiting; whether none is left."""
        if self._outgoing.pending:
            self._pending = memoryview(bytes(self._pending) + self._outgoing.read()) if self._pending else \
                memoryview(self._outgoing.read())
        while self._pending:
            try:
                sent = self.sock.send(self._pending)
            except _WOULD_BLOCK:
                return False
            self._pending = self._pending[sent:]
        return True

    def _read_socket(self) -> None:
        """Everything the socket holds, into the TLS library's incoming buffer."""
        while not self._eof:
            try:
                chunk = self.sock.recv(_READ_CHUNK)
            except _WOULD_BLOCK:
                return
            if not chunk:
                self._eof = True
                self._incoming.write_eof()
                return
            self._incoming.write(chunk)
