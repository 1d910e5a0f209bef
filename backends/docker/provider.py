"""``DockerSpaces``: each Space is a container of the ``durable-space`` image.

A Space is found again from any process by its container, never by in-memory state: the
container is named ``durable-space.<scope>.<name>`` (the engine refuses a second container
of that name, which makes ``create`` safe from parallel processes) and carries the labels
``durable.space=1``, ``durable.space.scope=<scope>`` and ``durable.space.name=<name>``
(which ``names`` and ``clean_all`` filter on). A provider sees only its own scope, so the
Spaces of parallel campaign runs never mix.

Inside, PID 1 is ``spacesd.supervisor``, which restarts the daemon when it dies; the workspace
(``/home/cua/work``) and the daemon's state (``/var/lib/spacesd``) live in the container's
writable layer (one filesystem: spacesd renames temp files from its state into the
workspace), so a restart keeps them and ``docker rm`` removes them. spacesd listens on port
7777 of the container, published on a random port of 127.0.0.1 only; a fresh token per
Space is passed in ``SPACESD_TOKEN`` (the daemon removes it from the environment of its
commands; the commands run as the daemon's user, so the token is no secret from them, only
from everything else on the host).

The faults are what they say:
- ``kill_daemon``: ``docker exec`` SIGKILLs spacesd (found by its pid file and checked
  against its start time); the supervisor starts a new one, which the ledger uses to
  reattach to the commands that kept running.
- ``restart``: ``docker restart -t 0``, every process in the container dies, the disk stays.
  The engine publishes the port again on a new random host port: clients find it through
  their resolver, which reads the container's port mapping on every reconnect.
- ``delete``: ``docker rm -fv``, the container and any volume it has.

``save_state`` copies the daemon's audit files out with the engine's archive API (``docker
cp``), which needs no process in the container: it works with the daemon down, and with the
container stopped.

Connection semantics differ with the engine's userland proxy: with it (the default), a
connection to the published port is accepted by ``docker-proxy`` even while the daemon is
down and then reset, which the client sees as a connection broken after sending (retried
once if idempotent, else ``SpaceUnavailable``). Without it (``dockerd
--userland-proxy=false``, what ``ci/docker.sh`` runs) the connection is refused exactly as
for a local Space, and the client waits for the daemon to come back. Both are correct; the
second turns fewer daemon restarts into driver crashes.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import secrets
import socket
import tarfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import docker
import docker.constants
import docker.errors
import requests.exceptions
from docker.types import LogConfig

from backends.descriptor import DiskName
from backends.docker.errors import DockerUnavailable
from backends.docker.exec_stream import exec_output
from backends.local import own_disks
from backends.local.provider import _NAME  # one rule for Space names on every backend
from backends.sources import IMAGE_LABEL, spacesd_digest
from backends.space_client import (
    REQUEST_TIMEOUT_S,
    Endpoint,
    HttpSpaceClient,
    Resolver,
    Via,
    routed,
)
from durable.chunk_reader import ChunkReader
from durable.errors import SpaceError, SpaceNotFound, SpaceUnavailable
from spacesd.failpoints import ENV_VAR as FAILPOINTS_ENV
from spacesd.protocol import (
    ERR_BAD_REQUEST,
    STATE_EPOCH,
    STATE_EXEC_DIR,
    STATE_FENCES,
    STATE_LEDGER,
    is_audit_file,
)

IMAGE = "durable-space"
LABEL = "durable.space"
LABEL_SCOPE = "durable.space.scope"
LABEL_NAME = "durable.space.name"
#: The host directory a container's workspace disk of its own is mounted on (``work_disk``).
LABEL_WORK_DISK = "durable.space.work-disk"
PORT = "7777/tcp"
TOKEN_ENV = "SPACESD_TOKEN"
#: The daemon's state directory in the image (``--state`` of the Dockerfile's CMD).
STATE_DIR = "/var/lib/spacesd"
#: Where a failpoint channel's socket directory is mounted in a Space's container.
FAILPOINTS_MOUNT = "/run/chaos-failpoints"
PID_FILE = f"{STATE_DIR}/daemon.pid"
WORKSPACE = "/home/cua/work"
#: The image's user ``cua`` (Dockerfile), who owns the workspace.
WORKSPACE_UID = 1000
_SCOPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,62}")  # no '.': it separates scope and name
#: Errors of the engine's API and of the HTTP connection to it.
_ENGINE_ERRORS = (docker.errors.DockerException, requests.exceptions.RequestException)


def _no_image(image: str) -> DockerUnavailable:
    return DockerUnavailable(f"the Space image {image!r} is not in the engine; build it with "
                             "`python -m chaos image build` (or ci/build-images.sh)")


@contextmanager
def _engine(failed: str, *, gone: str | None = None) -> Iterator[None]:
    """Translate the engine's errors in the block: the container not found becomes
    ``SpaceNotFound(gone)`` (when ``gone`` is given), any other engine or connection error
    ``SpaceUnavailable`` saying ``failed`` and why."""
    try:
        yield
    except docker.errors.NotFound:
        if gone is None:
            raise
        raise SpaceNotFound(gone) from None
    except _ENGINE_ERRORS as exc:
        raise SpaceUnavailable(f"{failed} ({exc})") from exc


@dataclass(frozen=True)
class Limits:
    """Resources of one Space (``docker run --cpus --memory --pids-limit``)."""

    cpus: float = 1.0
    memory: str = "1g"
    pids: int = 1024

    def __post_init__(self) -> None:
        if not (isinstance(self.cpus, (int, float)) and self.cpus > 0):
            raise ValueError(f"Expected cpus > 0 but got cpus={self.cpus!r}")
        if not (isinstance(self.pids, int) and self.pids > 0):
            raise ValueError(f"Expected an int pids > 0 but got pids={self.pids!r}")


@dataclass(frozen=True)
class DockerSpace:
    """One Space's container as the engine reports it now."""

    name: str
    container: str  # the container's name
    id: str
    status: str  # created | running | restarting | exited | ...
    endpoint: Endpoint | None  # None unless running with its port published


def _connect_engine(timeout: float) -> docker.DockerClient:
    """A client speaking the engine's API version (at most the SDK's). Not
    ``from_env(version="auto")``: when no engine answers, that leaks its socket."""
    host = os.environ.get("DOCKER_HOST") or docker.constants.DEFAULT_UNIX_SOCKET
    if host.startswith(("unix://", "http+unix://")):
        # The SDK leaks its socket when a unix socket does not answer: ask first ourselves.
        path = host.split("://", 1)[1]
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            try:
                sock.connect(path)
            except OSError as exc:
                raise DockerUnavailable(
                    f"no Docker engine answers at {host} ({exc}); start dockerd "
                    "(ci/docker.sh shows how) or set DOCKER_HOST") from None
    try:
        probe = docker.from_env(version=docker.constants.MINIMUM_DOCKER_API_VERSION,
                                timeout=int(timeout))
    except _ENGINE_ERRORS as exc:
        raise DockerUnavailable(f"cannot talk to a Docker engine ({exc}); check DOCKER_HOST") \
            from None
    try:
        server = probe.api.version(api_version=False)["ApiVersion"]
    except _ENGINE_ERRORS as exc:
        raise DockerUnavailable(
            f"no Docker engine answers ({exc}); start dockerd (ci/docker.sh shows how) or "
            "set DOCKER_HOST") from None
    finally:
        probe.close()
    newest = docker.constants.DEFAULT_DOCKER_API_VERSION
    version = min(server, newest, key=lambda v: tuple(int(p) for p in v.split(".")))
    return docker.from_env(version=version, timeout=int(timeout))


class DockerSpaces:
    """A ``durable.spaces.Spaces`` provider of containers (see the module docstring).

    ``label_scope`` separates providers (a campaign run passes its own); ``limits`` are each
    Space's resources; ``start_timeout`` bounds the wait for a healthy daemon after create,
    restart and kill_daemon. Raises ``DockerUnavailable`` when no engine answers or the
    image is missing. Close the provider (or use it as a context manager) to close its
    connection to the engine; its Spaces live on.
    """

    kind = "docker"

    def __init__(self, *, label_scope: str = "default", image: str = IMAGE,
                 limits: Limits | None = None, start_timeout: float = 60.0,
                 api_timeout: float = 60.0, failpoints: str | None = None,
                 request_timeout: float = REQUEST_TIMEOUT_S, via: Via | None = None,
                 work_disk: int | None = None, disk_dir: Path | None = None) -> None:
        """``work_disk``: every Space made from now on keeps its workspace on a disk of its
        own of that many bytes, as on a mounted volume: a tmpfs on the host (which needs
        root: ``backends.local.own_disks``) in ``disk_dir``, bound into its container, kept
        across a restart and gone with the container; ``fill_disk`` fills it. The size is
        written into ``disk_dir``, so that every provider made with the same ``disk_dir``
        (a driver's, which makes a lost Space again) gives its Spaces the same disk."""
        if not isinstance(label_scope, str) or not _SCOPE.fullmatch(label_scope):
            raise ValueError(f"Expected a label_scope of 1-63 of A-Z a-z 0-9 - (starting with "
                             f"a letter or digit) but got label_scope={label_scope!r}")
        if failpoints is not None and not failpoints.startswith("unix:"):
            raise ValueError(f"docker Spaces reach a failpoint channel only through a unix "
                             f"socket bind-mounted into the container; got {failpoints!r} "
                             "(use unix:/path)")
        #: The failpoint channel of the daemons in containers this provider creates.
        self.failpoints = failpoints
        self.scope = label_scope
        self.image = image
        self.limits = limits or Limits()
        self.start_timeout = start_timeout
        #: How long its clients wait for an answer before the outcome is unknown.
        self.request_timeout = request_timeout
        #: Where its clients' endpoints are routed (the campaign's link proxies), if anywhere.
        self.via = via
        if work_disk is not None and disk_dir is None:
            raise ValueError("a work_disk needs a disk_dir, the host directory its disks are "
                             "mounted in")
        # The engine binds only absolute host paths (a campaign's --results may be relative:
        # found by .ci/run's docker campaign, whose every create was refused).
        disk_dir = disk_dir.resolve() if disk_dir is not None else None
        if disk_dir is not None and work_disk is not None:
            disk_dir.mkdir(parents=True, exist_ok=True)
            own_disks.marker(disk_dir, "work").write_text(f"{work_disk}\n")
        elif disk_dir is not None:
            work_disk = own_disks.size_of(disk_dir, "work")
        self.work_disk, self.disk_dir = work_disk, disk_dir
        self._docker = _connect_engine(api_timeout)
        self._api = self._docker.api
        try:
            found = self._api.inspect_image(image)  # type: ignore[no-untyped-call]  # unannotated in types-docker
        except docker.errors.ImageNotFound:
            self.close()
            raise _no_image(image) from None
        except _ENGINE_ERRORS as exc:
            self.close()
            raise DockerUnavailable(f"the Docker engine did not answer ({exc})") from None
        built_from = ((found.get("Config") or {}).get("Labels") or {}).get(IMAGE_LABEL)
        if built_from != spacesd_digest():
            self.close()
            raise DockerUnavailable(
                f"the Space image {image!r} holds spacesd built from other sources than "
                f"this tree's ({IMAGE_LABEL} {built_from or 'missing'}, this tree "
                f"{spacesd_digest()}): its Spaces would run other code than the code under "
                "test. Rebuild it: `python -m chaos image build` (or ci/build-images.sh)")

    # ---------------------------------------------------------------- lifetime

    def close(self) -> None:
        self._docker.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"DockerSpaces(label_scope={self.scope!r}, image={self.image!r})"

    # ---------------------------------------------------------------- names

    def shell_hint(self, name: str) -> str:
        return f"docker exec -it {self.container_name(name)} bash -l"

    def container_name(self, name: str) -> str:
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise SpaceError(f"bad Space name {name!r}: use 1-100 of A-Z a-z 0-9 . _ -, "
                             "starting with a letter or digit (no '/')", code=ERR_BAD_REQUEST)
        return f"durable-space.{self.scope}.{name}"

    def _inspect(self, name: str) -> dict[str, Any]:
        """The container's inspect data; ``SpaceNotFound`` if it is not one of our Spaces."""
        cname = self.container_name(name)
        with _engine(f"Space {name!r}: the Docker engine did not answer",
                     gone=f"no Space {name!r} (container {cname}) in scope {self.scope!r}; "
                          "create it first"):
            attrs: dict[str, Any] = self._api.inspect_container(cname)
        labels = attrs["Config"].get("Labels") or {}
        if labels.get(LABEL_NAME) != name or labels.get(LABEL_SCOPE) != self.scope:
            raise SpaceNotFound(f"container {cname} exists but is not Space {name!r} of scope "
                                f"{self.scope!r} (labels {labels}); remove it")
        return attrs

    @staticmethod
    def _endpoint_of(attrs: dict[str, Any]) -> Endpoint | None:
        if not attrs["State"].get("Running"):
            return None
        bound = (attrs["NetworkSettings"].get("Ports") or {}).get(PORT) or []
        env = dict(e.split("=", 1) for e in attrs["Config"].get("Env") or [] if "=" in e)
        token = env.get(TOKEN_ENV)
        if not bound or not token:
            return None
        return Endpoint(bound[0].get("HostIp") or "127.0.0.1", int(bound[0]["HostPort"]), token)

    def get(self, name: str) -> DockerSpace:
        """The Space's container now; raises ``SpaceNotFound``."""
        attrs = self._inspect(name)
        return DockerSpace(name, attrs["Name"].lstrip("/"), attrs["Id"],
                           attrs["State"]["Status"], self._endpoint_of(attrs))

    def _resolver(self, name: str) -> Endpoint:
        attrs = self._inspect(name)
        endpoint = self._endpoint_of(attrs)
        if endpoint is None:
            raise SpaceUnavailable(f"Space {name!r}: its container is "
                                   f"{attrs['State']['Status']}, its daemon is not reachable")
        return endpoint

    # ---------------------------------------------------------------- the protocol

    def create(self, name: str) -> None:
        cname = self.container_name(name)
        try:
            attrs = self._inspect(name)
        except SpaceNotFound:
            attrs = None
        if attrs is None:
            self._create_container(name, cname)
        elif attrs["State"].get("Running") and self._healthy(name):
            return
        self._start(name)
        self._wait_healthy(name)

    def _create_container(self, name: str, cname: str) -> None:
        lim = self.limits
        binds = dict(self._failpoint_binds() or {})
        labels = {LABEL: "1", LABEL_SCOPE: self.scope, LABEL_NAME: name}
        disk = self._new_work_disk(cname)
        if disk is not None:
            binds[str(disk)] = {"bind": WORKSPACE, "mode": "rw"}
            labels[LABEL_WORK_DISK] = str(disk)
        host_config = self._api.create_host_config(
            port_bindings={PORT: ("127.0.0.1", None)},
            nano_cpus=int(lim.cpus * 1e9), mem_limit=lim.memory, pids_limit=lim.pids,
            cap_drop=["ALL"], security_opt=["no-new-privileges"],
            log_config=LogConfig(type="json-file", config={"max-size": "1m", "max-file": "2"}),
            binds=binds or None)
        environment = {TOKEN_ENV: secrets.token_hex(32)}
        if self.failpoints is not None:
            socket_name = os.path.basename(self.failpoints[len("unix:"):])
            environment[FAILPOINTS_ENV] = f"unix:{FAILPOINTS_MOUNT}/{socket_name}"
        created = False
        try:
            self._api.create_container(
                self.image, name=cname, detach=True, host_config=host_config,
                ports=[7777], environment=environment, labels=labels,
                use_config_proxy=False)
            created = True
        except docker.errors.ImageNotFound:
            raise _no_image(self.image) from None
        except docker.errors.APIError as exc:
            if exc.status_code != 409:  # 409: another process created it first; use that
                raise SpaceUnavailable(f"Space {name!r}: docker create failed ({exc})") from exc
        except _ENGINE_ERRORS as exc:
            raise SpaceUnavailable(f"Space {name!r}: docker create failed ({exc})") from exc
        finally:
            if disk is not None and not created:
                _drop_disk(str(disk))

    def _new_work_disk(self, cname: str) -> Path | None:
        """A new container's workspace disk (``work_disk``): a tmpfs of its own on the
        host, owned by the image's user; None without one. Each container gets its own
        directory, so a Space made again after a loss never finds the lost one's files."""
        if self.work_disk is None:
            return None
        assert self.disk_dir is not None
        disk = self.disk_dir / f"{cname}-{secrets.token_hex(4)}"
        disk.mkdir(parents=True)
        own_disks.mount_tmpfs(disk, self.work_disk, "leave --fill-work-disks off")
        os.chown(disk, WORKSPACE_UID, WORKSPACE_UID)
        return disk

    def _work_disk(self, name: str) -> Path:
        disk = (self._inspect(name)["Config"].get("Labels") or {}).get(LABEL_WORK_DISK)
        if disk is None:
            raise SpaceError(f"Space {name!r} keeps its workspace on its container's one disk: "
                             "make its provider with a work_disk before the Space is made")
        return Path(disk)

    def fill_disk(self, name: str, disk: DiskName, leave: int = 0) -> None:
        """Fill the Space's workspace disk of its own (``work_disk``) but ``leave`` bytes,
        until ``free_disk`` (``own_disks.fill``); a docker Space keeps its daemon's state on
        its container's one disk."""
        if disk != "work":
            raise SpaceError(f"a docker Space has no {disk} disk of its own to fill: it keeps "
                             "its daemon's state on its container's one disk")
        own_disks.fill(self._work_disk(name), leave)

    def free_disk(self, name: str, disk: DiskName) -> None:
        if disk == "work":
            own_disks.free(self._work_disk(name), self.work_disk)

    def _failpoint_binds(self) -> dict[str, Mapping[str, str]] | None:
        """The failpoint socket's directory, mounted where the daemon finds it (the socket
        must be writable by the container's user: ``Rendezvous(shared=True)``)."""
        if self.failpoints is None:
            return None
        directory = os.path.dirname(self.failpoints[len("unix:"):])
        return {directory: {"bind": FAILPOINTS_MOUNT, "mode": "rw"}}

    def _start(self, name: str) -> None:
        with _engine(f"Space {name!r}: docker start failed",
                     gone=f"Space {name!r} was removed while it was being started"):
            self._api.start(self.container_name(name))

    def exists(self, name: str) -> bool:
        try:
            self._inspect(name)
            return True
        except SpaceNotFound:
            return False
        except SpaceError as exc:
            if exc.code == ERR_BAD_REQUEST:
                return False
            raise

    def delete(self, name: str) -> None:
        cname = self.container_name(name)
        try:
            self._inspect(name)
        except SpaceNotFound:
            return
        self._remove(cname)

    def lose(self, name: str, keep: Path) -> None:
        """The Space is lost at one instant (a campaign fault): its container is paused
        (every process frozen, the daemon answers nothing more), renamed out of the way
        (a racing ``create`` makes a new Space rather than starting this one) and killed,
        its audit files as that instant left them are copied to ``keep`` (as
        ``save_state``), and it is removed. Raises ``SpaceNotFound``."""
        cname = self.container_name(name)
        self._inspect(name)
        lost = f"{cname}-lost-{secrets.token_hex(4)}"
        with _engine(f"Space {name!r}: freezing it for its loss failed",
                     gone=f"Space {name!r} was removed before its loss"):
            try:
                self._pause(cname)
            except docker.errors.APIError as exc:
                # Not running, nothing to freeze: 409 (stopped), or caught between a
                # restart's stop and its start, where Docker 20.10 answers 500 "cannot
                # pause a stopped container" (found by a docker campaign with
                # --pause-commands: a loss meeting a restart_space in flight). The kill
                # below ends whatever the restart starts.
                if exc.status_code != 409 and \
                        self._api.inspect_container(cname)["State"]["Running"]:
                    raise
            self._api.rename(cname, lost)
            self._kill_paused(lost)
        try:
            self._copy_state(lost, name, keep)
        finally:
            self._remove(lost)

    def _kill_paused(self, container: str) -> None:
        """SIGKILL every process of a paused container before its state is copied. The
        engine thaws a paused container to kill it (a force-removal too), and in that
        instant its daemon could still answer a request it had read: found by the loss
        contract test, an ``advance_epoch`` answered after the copy was made, so missing
        from the saved fence records. Once every process is dead, the copy holds all that
        any client was ever answered."""
        try:
            self._api.kill(container, signal="SIGKILL")
        except docker.errors.APIError as exc:
            if exc.status_code != 409:
                raise
            if "paused" in str(exc).lower():  # an engine that will not kill it paused
                self._api.unpause(container)
                self._api.kill(container, signal="SIGKILL")
            # else: not running (stopped already): nothing left to answer

    def _remove(self, container: str) -> None:
        """Remove ``container`` (and its workspace disk of its own, if it has one)."""
        try:
            labels = self._api.inspect_container(container)["Config"].get("Labels") or {}
        except docker.errors.NotFound:
            return
        except _ENGINE_ERRORS as exc:
            raise SpaceUnavailable(f"docker rm {container} failed ({exc})") from exc
        self._remove_container(container)
        if LABEL_WORK_DISK in labels:
            _drop_disk(labels[LABEL_WORK_DISK])

    def _remove_container(self, container: str) -> None:
        deadline = time.monotonic() + self.start_timeout
        while True:
            try:
                self._api.remove_container(container, v=True, force=True)
                return
            except docker.errors.NotFound:
                return
            except docker.errors.APIError as exc:
                # 409: a removal already in progress (another process deletes it too).
                if exc.status_code != 409 or time.monotonic() > deadline:
                    raise SpaceUnavailable(f"docker rm {container} failed ({exc})") from exc
                time.sleep(0.1)
            except _ENGINE_ERRORS as exc:
                raise SpaceUnavailable(f"docker rm {container} failed ({exc})") from exc

    def restart(self, name: str) -> None:
        """``docker restart -t 0``: every process dies, the disk stays, the daemon comes
        back (on a new host port) healthy before this returns."""
        cname = self.container_name(name)
        self._inspect(name)
        with _engine(f"Space {name!r}: docker restart failed",
                     gone=f"Space {name!r} was removed during its restart"):
            self._api.restart(cname, timeout=0)
        self._wait_healthy(name)

    def kill_daemon(self, name: str) -> None:
        """SIGKILL spacesd inside (``docker exec``); the supervisor starts a new one, healthy
        before this returns. Commands keep running."""
        code, out = self.exec_in(name, ["python3", "-m", "spacesd.supervisor", "kill-daemon",
                                        "--pid-file", PID_FILE,
                                        "--timeout", str(self.start_timeout)])
        # 1: no daemon was running (one is being restarted already): wait for it all the same.
        if code not in (0, 1):
            raise SpaceUnavailable(f"Space {name!r}: kill-daemon exited {code}: {out.strip()}"
                                   f"\n{self._log_tail(self.container_name(name))}")
        self._wait_healthy(name)

    def pause_daemon(self, name: str) -> None:
        """spacesd alone frozen (SIGSTOP, through ``docker exec``): its commands run on.
        Raises ``SpaceUnavailable`` when no daemon runs."""
        if self._supervisor_signal(name, "STOP")[0] == 1:
            raise SpaceUnavailable(f"Space {name!r} has no daemon running to freeze")

    def resume_daemon(self, name: str) -> None:
        """SIGCONT to spacesd; none running is nothing to thaw."""
        self._supervisor_signal(name, "CONT")

    def pause_commands(self, name: str) -> list[str]:
        """Every process of spacesd's commands frozen (SIGSTOP, through ``docker exec``)
        while spacesd answers; the keys whose shim it froze (the command prints them).
        Raises ``SpaceError`` when no command runs."""
        code, out = self._supervisor_signal(name, "STOP", "signal-commands", "--state",
                                            STATE_DIR)
        if code == 1:
            raise SpaceError(f"Space {name!r} has no command running to freeze")
        return out.split()

    def resume_commands(self, name: str) -> None:
        """SIGCONT to every process of spacesd's commands."""
        self._supervisor_signal(name, "CONT", "signal-commands", "--state", STATE_DIR)

    def _supervisor_signal(self, name: str, sig: str, verb: str = "signal-daemon",
                           *args: str) -> tuple[int, str]:
        """``python -m spacesd.supervisor <verb>`` in the container: ``sig`` to the daemon
        (``signal-daemon``) or to its commands (``signal-commands``); its exit code (1: none
        to signal) and output."""
        code, out = self.exec_in(name, ["python3", "-m", "spacesd.supervisor", verb, *args,
                                        "--pid-file", PID_FILE, "--signal", sig])
        if code not in (0, 1):
            raise SpaceUnavailable(f"Space {name!r}: {verb} {sig} exited {code}: "
                                   f"{out.strip()}")
        return code, out

    def pause(self, name: str) -> None:
        """``docker pause``: every process of the Space frozen where it stands (the cgroup
        freezer); ``resume`` thaws them. A paused Space is left as it is; a stopped one
        raises ``SpaceUnavailable``."""
        self._freeze(name, pause=True)

    def resume(self, name: str) -> None:
        """``docker unpause``; a Space that is not paused is left as it is."""
        self._freeze(name, pause=False)

    def _freeze(self, name: str, *, pause: bool) -> None:
        cname, how = self.container_name(name), "pause" if pause else "unpause"
        state = self._inspect(name)["State"]
        if pause and not state.get("Running"):
            raise SpaceUnavailable(f"Space {name!r}: its container is not running; nothing "
                                   "to pause")
        if not state.get("Running") or bool(state.get("Paused")) == pause:
            return  # the engine refuses either (409 or 500): nothing to change
        with _engine(f"Space {name!r}: docker {how} failed",
                     gone=f"Space {name!r} was removed during docker {how}"):
            (self._pause if pause else self._api.unpause)(cname)

    #: How often a freeze the runtime could not finish in time is tried again.
    FREEZE_TRIES = 5

    def _pause(self, container: str) -> None:
        """``docker pause``, tried again when the runtime gave up waiting for the cgroup to
        freeze ("unable to freeze": a task in the middle of a fork or of uninterruptible
        I/O, on a loaded machine); the container is left running then, so a new try is
        safe."""
        for tries_left in reversed(range(self.FREEZE_TRIES)):
            try:
                self._api.pause(container)
                return
            except docker.errors.APIError as exc:
                if not tries_left or "unable to freeze" not in str(exc.explanation or exc):
                    raise
            time.sleep(0.2)

    def kill_process(self, name: str, pid: int) -> None:
        """SIGKILL one process of the Space by its pid *inside the container* (a command's
        shim, say): ``docker exec kill -9``; ``SpaceError`` when there is no such process."""
        code, out = self.exec_in(name, ["kill", "-9", str(int(pid))])
        if code != 0:
            raise SpaceError(f"Space {name!r}: no process {pid} to kill ({out.strip()})")

    def exec_in(self, name: str, argv: list[str]) -> tuple[int, str]:
        """``docker exec`` ``argv`` in the Space as its user (outside spacesd, for faults,
        tests and debugging); returns the exit code and the output (stdout and stderr)."""
        cname = self.container_name(name)
        self._inspect(name)
        with _engine(f"Space {name!r}: docker exec {argv[0]} failed",
                     gone=f"Space {name!r} was removed during docker exec"):
            ex = self._api.exec_create(cname, argv)
            out = exec_output(self._api, ex["Id"]).decode(errors="replace")
            # The engine records the exit code before it closes the output stream.
            code = self._api.exec_inspect(ex["Id"])["ExitCode"]
        if code is None:
            raise SpaceUnavailable(f"Space {name!r}: docker exec {argv[0]}: the engine "
                                   "closed its output but has no exit code for it")
        return code, out

    def save_state(self, name: str, dest: Path) -> None:
        """Copy what an audit reads of the daemon's state (ledger, fence journal, epoch,
        claim and exit files: ``spacesd.protocol.is_audit_file``) into ``dest`` (created),
        for ``spacesd.audit.read_state(dest)``. Works whether the daemon is up or not;
        raises ``SpaceNotFound``. The ledger is copied first (see ``LocalSpaces``)."""
        self._inspect(name)
        self._copy_state(self.container_name(name), name, dest)

    def _copy_state(self, cname: str, name: str, dest: Path) -> None:
        dest = Path(dest)
        (dest / STATE_EXEC_DIR).mkdir(parents=True, exist_ok=True)
        for rel in (STATE_LEDGER, STATE_FENCES, STATE_EPOCH, STATE_EXEC_DIR):
            try:
                chunks, _ = self._api.get_archive(cname, f"{STATE_DIR}/{rel}")
                # A file's archive holds it by its name, a directory's its files under the
                # directory's name: member names are paths relative to the state directory.
                with tarfile.open(fileobj=io.BufferedReader(ChunkReader(chunks)),
                                  mode="r|") as tar:
                    for member in tar:
                        src = tar.extractfile(member) if is_audit_file(member.name) else None
                        if src is not None:
                            (dest / member.name).write_bytes(src.read())
            except docker.errors.NotFound:
                # SpaceNotFound if the container went; else there is no such file yet
                with _engine(f"Space {name!r}: the Docker engine did not answer",
                             gone=f"Space {name!r} (container {cname}) was removed while its "
                                  "state was being copied"):
                    self._api.inspect_container(cname)
            except (*_ENGINE_ERRORS, tarfile.TarError) as exc:
                raise SpaceUnavailable(f"Space {name!r}: copying {STATE_DIR}/{rel} out of the "
                                       f"container failed ({exc}); try again") from exc

    def connect(self, name: str, *, epoch: int) -> HttpSpaceClient:
        self._inspect(name)
        return HttpSpaceClient(name, epoch, routed(name, self.endpoint(name), self.via),
                               timeout=self.request_timeout)

    def endpoint(self, name: str) -> Resolver:
        """How to find the daemon of ``name`` as it is when asked (port and token)."""
        return lambda: self._resolver(name)

    def names(self) -> list[str]:
        return sorted(c["Labels"][LABEL_NAME] for c in self._containers(self.scope))

    # ---------------------------------------------------------------- cleanup

    def delete_all(self) -> None:
        """Delete every Space of this provider's scope (test and benchmark cleanup)."""
        for c in self._containers(self.scope):
            self._remove(c["Id"])

    def _containers(self, scope: str | None) -> list[dict[str, Any]]:
        labels = [f"{LABEL}=1"] + ([f"{LABEL_SCOPE}={scope}"] if scope else [])
        with _engine("the Docker engine did not list containers"):
            found = self._api.containers(all=True, filters={"label": labels})
        return [c for c in found if LABEL_NAME in (c.get("Labels") or {})]

    @classmethod
    def clean_all(cls) -> int:
        """Remove every Space container of every scope (with its volumes), as left behind
        by crashed campaigns; returns how many. Spaces of a campaign still running are
        removed too: run it when none is. ``DockerUnavailable`` when no engine answers."""
        engine = _connect_engine(60)
        try:
            found = engine.api.containers(all=True, filters={"label": [f"{LABEL}=1"]})
            for c in found:
                try:
                    engine.api.remove_container(c["Id"], v=True, force=True)
                except docker.errors.NotFound:
                    pass
                disk = (c.get("Labels") or {}).get(LABEL_WORK_DISK)
                if disk is not None:
                    _drop_disk(disk)
            return len(found)
        finally:
            engine.close()

    # ---------------------------------------------------------------- health

    def _healthy(self, name: str) -> bool:
        try:
            HttpSpaceClient(name, 0, lambda: self._resolver(name), timeout=5.0,
                        retry_for=0).health()
            return True
        except SpaceNotFound:
            raise
        except SpaceError:
            return False

    def _wait_healthy(self, name: str) -> None:
        """Until the daemon answers ``health`` through the published port. Fails at once
        with the container's log when the container stopped (a broken image), else after
        ``start_timeout``."""
        deadline = time.monotonic() + self.start_timeout
        while True:
            if self._healthy(name):
                return
            attrs = self._inspect(name)
            state = attrs["State"]
            if not state.get("Running") and state.get("Status") in ("exited", "dead"):
                raise SpaceUnavailable(
                    f"Space {name!r}: its container stopped (exit {state.get('ExitCode')}, "
                    f"{state.get('Error') or 'no error'}); its log ends with:\n"
                    f"{self._log_tail(attrs['Name'].lstrip('/'))}")
            if time.monotonic() > deadline:
                raise SpaceUnavailable(
                    f"Space {name!r}: its daemon was not healthy within {self.start_timeout}s;"
                    f" the container's log ends with:\n{self._log_tail(attrs['Name'][1:])}")
            time.sleep(0.05)

    def _log_tail(self, container: str) -> str:
        try:
            return self._api.logs(container, tail=30).decode(errors="replace")
        except _ENGINE_ERRORS as exc:
            return f"(no log: {exc})"


def _drop_disk(directory: str) -> None:
    """Unmount a workspace disk of a container's own and remove its directory (what it
    held is gone with its container)."""
    own_disks.unmount(Path(directory))
    with contextlib.suppress(OSError):  # left where it is when something else is in it
        os.rmdir(directory)
