"""``python -m chaos.run.driver_server``: the campaign's drivers, forked from one process that has
imported them.

Why: a driver attempt starts a Python interpreter and imports the adapter, the log, the
backends and the scenarios (about 150 ms on these machines) before its first step, and a
campaign starts several attempts per run: that was most of the time from a kill to the next
driver's first step, and a large part of a campaign. This server imports ``chaos.driver``
once; each driver is a fork of it.

What stays the same for the driver: it is a new process, in a session of its own (so the
nemesis SIGKILLs its process group, as before), with the environment, argument list and
output file the runner gave it, and it runs ``chaos.driver.main`` from the beginning: the
server runs nothing of a session, so no state of one run can reach another. The only
import-time state that depends on the process is made again in each driver
(``_become_driver``): the failpoint channel (from the driver's own environment) and the
client's ``advance_epoch`` owner; ``random`` reseeds itself at fork. The runner's pid that
a driver must not outlive (``live.RUNNER_PID_ENV``) becomes the server's, and the server in
turn does not outlive the runner: when the runner closes the channel, or dies (the kernel
closes it), the server SIGKILLs the process group of every driver still running and exits.
(Not ``PR_SET_PDEATHSIG``: that follows the *thread* that started the server, and a
campaign's runs start it from threads that end.)

Protocol, over the socket whose descriptor is its argument, one JSON object per line: the
runner sends ``{"id", "module", "argv", "env", "log"}`` (a module with ``main(argv) -> int``,
as ``python -m module argv`` would run it: ``chaos.driver``, imported here beforehand, or
any other, imported by the child); the server answers ``{"id", "pid"}`` or ``{"id",
"error"}``, and later ``{"exited": pid, "code": code}`` with the code as ``subprocess`` gives
it (negative: killed by that signal).
"""

from __future__ import annotations

import importlib
import json
import os
import select
import signal
import sys
from typing import Any, NoReturn

import chaos.driver  # noqa: F401 - imported once here, for every driver forked
from backends import space_client
from chaos.campaign import live
from durable import failpoints
from spacesd.forked_main import exit_as_main


def _become_driver(request: dict[str, Any], log: int, server_fds: list[int]) -> NoReturn:
    """In the forked child: become the driver the request describes, its output to ``log``
    (``server_fds``: the server's own descriptors, closed first); never returns."""

    def main() -> int:
        for fd in server_fds:
            os.close(fd)
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(null)
        os.close(log)
        os.environ.clear()
        os.environ.update(request["env"])
        os.environ[live.RUNNER_PID_ENV] = str(os.getppid())
        live.die_with_parent()  # whatever the module does: no driver outlives the server
        failpoints.reopen()
        space_client.new_process_owner()
        sys.argv = [request["module"], *request["argv"]]
        return int(importlib.import_module(request["module"]).main(request["argv"]) or 0)

    exit_as_main(main)


def _send(channel: int, message: dict[str, Any]) -> None:
    data = (json.dumps(message) + "\n").encode()
    while data:
        data = data[os.write(channel, data):]


def serve(channel: int) -> None:
    poller = select.poll()
    poller.register(channel, select.POLLIN)
    children: dict[int, int] = {}  # pidfd -> pid
    pending = b""
    while True:
        for fd, _ in poller.poll():
            if fd in children:
                pid = children.pop(fd)
                poller.unregister(fd)
                os.close(fd)
                _, status = os.waitpid(pid, 0)
                _send(channel, {"exited": pid, "code": os.waitstatus_to_exitcode(status)})
                continue
            chunk = os.read(channel, 65536)
            if not chunk:  # the runner is done (or gone): no driver outlives it
                for pid in children.values():
                    try:
                        os.killpg(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                return
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = json.loads(line)
                sys.stdout.flush()
                sys.stderr.flush()
                try:  # the log exists once the runner has the pid, as with a spawned driver
                    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                    pid = os.fork()
                except OSError as exc:
                    _send(channel, {"id": request["id"], "error": f"cannot fork a driver: {exc}"})
                    continue
                if pid == 0:
                    _become_driver(request, log, [channel, *children])
                os.close(log)
                pidfd = os.pidfd_open(pid)
                children[pidfd] = pid
                poller.register(pidfd, select.POLLIN)
                _send(channel, {"id": request["id"], "pid": pid})


if __name__ == "__main__":
    serve(int(sys.argv[1]))
