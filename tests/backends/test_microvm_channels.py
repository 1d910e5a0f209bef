"""The microVM's control channels on fake peers (no QEMU needed): a machine that goes away
mid-command is ``SpaceUnavailable``, never a raw socket error (which the harness would record
as the tool's error: found by the checkpoint campaign) and never a silent success."""

from __future__ import annotations

import socket
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from backends.microvm.machine import QMP, Agent
from durable.errors import SpaceUnavailable


@pytest.fixture
def peer() -> Iterator[Callable[[Callable[[socket.socket], None]], Path]]:
    tmp = Path(tempfile.mkdtemp(prefix="cua-chan-"))
    servers: list[socket.socket] = []

    def serve(behave: Callable[[socket.socket], None]) -> Path:
        path = tmp / f"s{len(servers)}.sock"
        srv = socket.socket(socket.AF_UNIX)
        srv.bind(str(path))
        srv.listen(1)
        servers.append(srv)

        def run() -> None:
            conn, _ = srv.accept()
            with conn:
                behave(conn)

        threading.Thread(target=run, daemon=True).start()
        return path

    yield serve
    for srv in servers:
        srv.close()


def test_a_qmp_peer_that_hangs_up_mid_command_is_unavailable(peer) -> None:
    def greet_then_close(conn: socket.socket) -> None:
        conn.sendall(b'{"QMP": {}}\n')
        conn.recv(1000)  # qmp_capabilities
        conn.sendall(b'{"return": {}}\n')
        conn.recv(1000)  # the command: then the machine loses power

    with pytest.raises(SpaceUnavailable, match="QEMU closed the channel"):
        QMP(peer(greet_then_close), 5).command("migrate", uri="exec:cat >/dev/null")

    def reset(conn: socket.socket) -> None:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")

    with pytest.raises(SpaceUnavailable):
        QMP(peer(reset), 5).command("stop")


def test_an_agent_that_hangs_up_is_unavailable(peer) -> None:
    def answer_ping_then_close(conn: socket.socket) -> None:
        line = conn.recv(1000).decode()
        conn.sendall(f"{line.split()[0]} ok\n".encode())
        conn.recv(1000)  # the command: gone before the answer

    with pytest.raises(SpaceUnavailable, match="closed before answering"):
        Agent(peer(answer_ping_then_close), 5).call("state")
