"""The endpoint: the lock that keeps a second daemon off, the socket files' mode and group, stale files."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from client_stub.contract import ipc
from client_stub.contract.shared_memory import ERR
from service.front import EndpointInUseError
from service.front.checks import max_message_size
from service.front.endpoint import Endpoint
from service.front.replies import SEND_HWM
from tests.support.front import (
    Env,
)
from tests.support.waiting import HANG_S


@pytest.fixture
def context() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        yield context
    finally:
        context.term()


def bind(address: str, context: zmq.Context[zmq.Socket[bytes]], **options: Any) -> Endpoint:
    return Endpoint(address, "d1", max_message_size=max_message_size(4), send_hwm=SEND_HWM, context=context,
                    **options)


def test_second_daemon_on_an_ipc_endpoint_is_refused(context: zmq.Context[zmq.Socket[bytes]], tmp_path: Path) -> None:
    path = tmp_path / "run" / "sidecar.sock"
    endpoint = f"ipc://{path}"
    memory = path.with_name("sidecar.sock.memory")
    first = bind(endpoint, context)
    try:
        assert path.exists()  # the directory was made
        assert stat.S_ISSOCK(memory.stat().st_mode) and first.memory.path == str(memory)
        with pytest.raises(EndpointInUseError, match="another kafka-sidecar daemon"):
            bind(endpoint, context)
        # The refused one left the first's memory socket alone: its clients still get their segments.
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        probe.connect(str(memory))
        probe.close()
    finally:
        first.close_socket()
        first.close()
    assert not path.exists() and not memory.exists() and not path.parent.exists()


def test_an_endpoint_locked_by_a_live_daemon_is_refused_before_its_socket_exists(
        context: zmq.Context[zmq.Socket[bytes]], tmp_path: Path) -> None:
    # The lock, not a probe of the socket: a daemon that has taken the endpoint but not bound yet (or two
    # starting at once) cannot both be told the endpoint is free.
    path = tmp_path / "sidecar.sock"
    holder = subprocess.Popen([sys.executable, "-c", f"import fcntl, sys; f = open({str(path) + '.lock'!r}, 'w'); "
                               "fcntl.flock(f, fcntl.LOCK_EX); print('locked', flush=True); sys.stdin.read()"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(EndpointInUseError):
            bind(f"ipc://{path}", context)
        assert not path.exists()
    finally:
        holder.kill()
        holder.communicate()
    endpoint = bind(f"ipc://{path}", context)  # the holder is gone
    endpoint.close_socket()
    endpoint.close()


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o000])
@pytest.mark.parametrize(("mode", "directory_mode"), [(0o660, 0o750), (0o600, 0o700), (0o666, 0o755)])
def test_socket_and_its_directory_have_the_configured_mode_and_group_whatever_the_umask(
        context: zmq.Context[zmq.Socket[bytes]], tmp_path: Path, umask: int, mode: int, directory_mode: int) -> None:
    path = tmp_path / "run" / "sidecar.sock"
    group = 65534 if os.geteuid() == 0 else os.getegid()
    previous = os.umask(umask)
    try:
        endpoint = bind(f"ipc://{path}", context, mode=mode, group=group)
    finally:
        os.umask(previous)
    try:
        assert (stat.S_IMODE(path.stat().st_mode), path.stat().st_gid) == (mode, group)
        assert (stat.S_IMODE(path.parent.stat().st_mode), path.parent.stat().st_gid) == (directory_mode, group)
        # Whoever may use the ipc socket may get a segment over the memory socket, and nobody else.
        memory = path.with_name("sidecar.sock.memory")
        assert (stat.S_IMODE(memory.stat().st_mode), memory.stat().st_gid) == (mode, group)
    finally:
        endpoint.close_socket()
        endpoint.close()


def test_stale_ipc_socket_files_are_replaced(env: Env, tmp_path: Path) -> None:
    path = tmp_path / "sidecar.sock"
    for name, kind in ((path, socket.SOCK_STREAM), (path.with_name("sidecar.sock.memory"), socket.SOCK_SEQPACKET)):
        stale = socket.socket(socket.AF_UNIX, kind)
        stale.bind(str(name))
        stale.close()  # the file stays, nobody listens: a daemon that died
    front = env.front_at(f"ipc://{path}")
    client = env.context.socket(zmq.DEALER)
    memory = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        client.setsockopt(zmq.LINGER, 0)
        client.connect(f"ipc://{path}")
        client.send(ipc.pack(ipc.Heartbeat.TYPE))
        assert front.endpoint.socket.poll(HANG_S * 1000)
        front.handle_readable()
        assert client.poll(HANG_S * 1000)
        assert ipc.unpack(client.recv())[0] == ipc.Error.TYPE
        memory.connect(str(path.with_name("sidecar.sock.memory")))
        memory.send(bytes(16))
        env.serve()  # accepted
        env.serve()  # its token read
        memory.settimeout(HANG_S)
        assert memory.recv(4096).startswith(ERR)  # the new daemon answers there
    finally:
        memory.close()
        client.close()
        front.close()


def test_tcp_endpoint_in_use_is_an_error(context: zmq.Context[zmq.Socket[bytes]]) -> None:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    probe.listen()
    port = probe.getsockname()[1]
    try:
        with pytest.raises(zmq.ZMQError):
            bind(f"tcp://127.0.0.1:{port}", context)
    finally:
        probe.close()
