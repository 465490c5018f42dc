"""ClientError: what a client got wrong, apart from the daemon's own bugs."""

from __future__ import annotations

from client_stub.contract import ipc


class ClientError(Exception):
    """A client sent something the daemon refuses: a malformed or hostile message, blocks that are not its own,
    more than its share. The daemon answers the client with why (an ERROR of ``code``), then with ``answer`` if
    the client waits for one (so that it fails now rather than at its timeout), and logs it, rate-limited; any
    other exception met while serving a client is the daemon's bug, logged with its traceback."""

    def __init__(self, message: str, code: str = ipc.ERROR_REFUSED, answer: ipc.Message | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.answer = answer
