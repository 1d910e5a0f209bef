"""The command line and environment of a driver: of the run's session, or of another one.

The driver (``chaos.driver`` by default, or the spec's program) reads its session from
``CUA_SESSION_*`` and its failpoint channel from ``CUA_FAILPOINTS`` (the driver's own
points) and ``SPACE_FAILPOINTS_ENV`` (the daemons it brings up); a driver without
failpoints gets neither, whatever the runner's own environment says.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from chaos.campaign import live
from chaos.driver import SPACE_FAILPOINTS_ENV
from chaos.run.processes import python_argv
from chaos.run.spec import RunSpec
from durable.session_log import LOG_STORAGE_ENV


@dataclass(frozen=True)
class OtherSession:
    """A driver of another log on the run's Spaces provider (stale mode's foreign kind)."""

    name: str
    seed: int
    preset: str
    run_dir: Path
    epoch: int = 1


def driver_log(run_dir: Path, attempt: int, epoch: int) -> Path:
    """Where a driver's output (stdout and stderr, its ``CUA-EXIT`` line last) goes."""
    return run_dir / f"driver-{attempt:02d}-e{epoch}.log"


def driver_argv(spec: RunSpec, run_dir: Path, other: OtherSession | None, *,
                request_timeout: float | None = None, links: Path | None = None) -> list[str]:
    """argv of a driver of the run in ``run_dir`` (``spec``'s session, or ``other``);
    ``request_timeout``: its clients' (None: the default); ``links``: the directory of the
    run's link proxies (``chaos.faults.link_proxy.LinkTable``), if its clients go through them."""
    program = ([sys.executable, spec.driver] if spec.driver.endswith(".py")
               else python_argv(spec.driver))
    argv = program + ["--run-dir", str(other.run_dir if other else run_dir),
                      "--preset", other.preset if other else spec.preset,
                      "--seed", str(other.seed if other else spec.seed),
                      "--mode", spec.durable_mode, "--backend", spec.backend]
    if other is not None:
        argv += ["--spaces-dir", str(run_dir)]
    if spec.steps is not None and (other is None or other.preset == spec.preset):
        argv += ["--steps", str(spec.steps)]
    if spec.keep_steps is not None and other is None:
        argv += ["--keep-steps", ",".join(map(str, spec.keep_steps))]
    if spec.snapshots != "auto":
        argv += ["--snapshots", spec.snapshots]
    if spec.simple_steps and other is None:
        argv += ["--simple-steps", ",".join(map(str, spec.simple_steps))]
    if request_timeout is not None:
        argv += ["--request-timeout", str(request_timeout)]
    if links is not None:
        argv += ["--links", str(links)]
    return argv


def driver_env(*, session: str, epoch: int, state_dir: Path, heartbeat: float,
               failpoints: str | None, log_storage: str) -> dict[str, str]:
    """The environment of a driver of ``session`` at ``epoch``: this process's, with the
    session's variables, and this interpreter's import path."""
    env = {**os.environ, live.RUNNER_PID_ENV: str(os.getpid()),
           "CUA_SESSION_NAME": session, "CUA_SESSION_EPOCH": str(epoch),
           "CUA_STATE_DIR": str(state_dir), "CUA_SESSION_HEARTBEAT_SECS": str(heartbeat),
           LOG_STORAGE_ENV: log_storage,
           "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    env.pop("CUA_FAILPOINTS", None)
    env.pop(SPACE_FAILPOINTS_ENV, None)
    if failpoints:
        env["CUA_FAILPOINTS"] = env[SPACE_FAILPOINTS_ENV] = failpoints
    return env
