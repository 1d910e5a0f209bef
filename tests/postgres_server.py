"""A throwaway PostgreSQL server for the coordinator's tests and campaigns: ``initdb`` in a
temp directory, ``postgres`` on 127.0.0.1 with a random port and a random password
(scram-sha-256), owned and ended by its pid.

``CUA_TEST_POSTGRES=postgresql://...`` names an existing server instead. As root the server
runs as the ``postgres`` user (Debian's package makes it); PostgreSQL refuses to run as root.

``python -m tests.postgres_server`` starts one, prints its URL and serves until Ctrl-C (for
a campaign by hand: ``chaos run --mode redrive --store URL``).
"""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

URL_ENV = "CUA_TEST_POSTGRES"


class NoPostgres(Exception):
    """Why no server can be had here (the tests skip with this reason)."""


def _bin(name: str) -> str:
    found = shutil.which(name) or next(iter(sorted(glob.glob(
        f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None)
    if not found:
        raise NoPostgres(f"no {name} here: install Debian's postgresql (apt-get install "
                         f"postgresql), or set {URL_ENV}=postgresql://... to a server")
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresServer:
    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.dir = Path(tempfile.mkdtemp(prefix="cua-pg-"))
        self.password = secrets.token_hex(16)
        self.port = _free_port()
        self.url = f"postgresql://cua:{self.password}@127.0.0.1:{self.port}/postgres"

    def _as_owner(self) -> tuple[list[str], int | None]:
        if os.getuid() != 0:
            return [], None
        try:
            uid = pwd.getpwnam("postgres").pw_uid
        except KeyError:
            raise NoPostgres("running as root and there is no postgres user to run the "
                             "server as (Debian's postgresql package makes it)") from None
        return [shutil.which("runuser") or "runuser", "-u", "postgres", "--"], uid

    def start(self, timeout: float = 60.0) -> PostgresServer:
        prefix, uid = self._as_owner()
        initdb, postgres = _bin("initdb"), _bin("postgres")
        data, sock = self.dir / "data", self.dir / "sock"
        sock.mkdir()
        pwfile = self.dir / "pw"
        pwfile.write_text(self.password + "\n")
        if uid is not None:
            for path in (self.dir, sock, pwfile):
                os.chown(path, uid, -1)
        subprocess.run(prefix + [initdb, "-D", str(data), "-U", "cua", "--auth=scram-sha-256",
                                 f"--pwfile={pwfile}", "-E", "UTF8", "--no-sync"],
                       check=True, capture_output=True)
        with open(self.dir / "server.log", "wb") as log:  # the child keeps its own copy
            self.proc = subprocess.Popen(
                prefix + [postgres, "-D", str(data), "-h", "127.0.0.1", "-p", str(self.port),
                          "-k", str(sock), "-c", "fsync=off", "-c", "max_connections=200"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise NoPostgres(f"postgres exited {self.proc.returncode}: "
                                 f"{(self.dir / 'server.log').read_text()[-800:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    pass
                import psycopg

                psycopg.connect(self.url, connect_timeout=2).close()
                return self
            except (OSError, ImportError) as exc:
                if isinstance(exc, ImportError):
                    raise NoPostgres("psycopg is not installed: pip install -e "
                                     "'.[postgres]'") from None
            except Exception:  # noqa: BLE001 - starting up: try again
                pass
            time.sleep(0.2)
        self.stop()
        raise NoPostgres(f"postgres did not accept connections within {timeout:.0f} s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # the server's own group, by its pid
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def main() -> int:
    server = PostgresServer().start()
    print(server.url, flush=True)
    try:
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    sys.exit(main())
