"""Loopback port helpers."""

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port on ``host`` that the kernel considered free a moment ago.

    Inherently racy (another process may take the port before the caller binds it): use
    it only for programs that must be told their port up front. Servers written here bind
    port 0 themselves instead.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port
