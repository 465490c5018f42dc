"""SASL's client side, as Kafka's SaslClientAuthenticator: the mechanisms' messages, sans-IO.

The NetworkClient carries them in SaslHandshake and SaslAuthenticate requests (KIP-152) once
a connection's ApiVersions are known, before any other request; each :class:`SaslExchange`
is one authentication of one connection (a new one for each re-authentication, KIP-368).
PLAIN is RFC 4616's one message; SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, 7677) are the
scramp library's, which checks the server's nonce, salt, iteration count and signature.
"""

from __future__ import annotations

from dataclasses import dataclass

import scramp

from client_stub.errors import AuthenticationError


@dataclass(frozen=True, slots=True)
class SaslCredentials:
    """What authenticates the daemon to the brokers."""

    mechanism: str
    username: str
    password: str


class SaslExchange:
    """The client's messages of one authentication: :meth:`first`, then :meth:`respond` to each of the
    broker's, which returns the next message, or None once the broker has proven itself (SCRAM) or
    accepted (PLAIN)."""

    def __init__(self, credentials: SaslCredentials) -> None:
        self.mechanism = credentials.mechanism
        self._credentials = credentials
        self._scram: scramp.ScramClient | None = None
        self._step = 0
        if self.mechanism.startswith("SCRAM-"):
            self._scram = scramp.ScramClient([self.mechanism], credentials.username, credentials.password)

    def first(self) -> bytes:
        if self._scram is None:
            # RFC 4616: [authzid] NUL authcid NUL passwd, without an authorization id.
            return b"\0" + self._credentials.username.encode() + b"\0" + self._credentials.password.encode()
        return self._scram.get_client_first().encode()

    def respond(self, challenge: bytes) -> bytes | None:
        self._step += 1
        if self._scram is None:
            return None  # PLAIN's one message was accepted
        try:
            if self._step == 1:
                self._scram.set_server_first(challenge.decode())
                return self._scram.get_client_final().encode()
            self._scram.set_server_final(challenge.decode())
        except (scramp.ScramException, UnicodeDecodeError) as exc:
            # A broker that does not know the password (or is not the broker) cannot sign the exchange.
            raise AuthenticationError(f"the broker's {self.mechanism} answer does not verify: {exc}",
                                      code=58, name="SASL_AUTHENTICATION_FAILED") from None
        return None
