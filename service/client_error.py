"""ClientError: what a client got wrong, apart from the daemon's own bugs."""

from __future__ import annotations


class ClientError(Exception):
    """A client sent something the daemon refuses: a malformed or hostile message, blocks that are not its own,
    more than its share. The daemon answers the client with why and logs it, rate-limited; any other exception
    met while serving a client is the daemon's bug, logged with its traceback."""
