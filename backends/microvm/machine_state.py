"""A microVM's whole state (memory, devices and disk) saved into a directory on the host,
and a Space started from such a directory: what a whole-machine checkpoint is
(``SandboxSnapshots`` keeps them), outside the Space, so that it outlives it.

A saved state is a directory of four files:

- ``memory.zst``: QEMU's migration stream (every device and page of memory), compressed with
  zstd as QEMU writes it (``migrate`` to ``exec:zstd``); about 45 MB for a 512 MiB guest;
- ``disk.qcow2.zst``: the Space's qcow2 overlay (what the guest wrote over the base disk)
  at the instant the stream ended, compressed;
- ``machine.json`` and ``token``: the machine's spec and artifacts, and the token its daemon
  was started with (a machine started from the state is that daemon).

Saving migrates the running machine out (QEMU stops it when the stream is complete, so the
disk copied next is the disk of that instant) and lets it go on. Loading kills the Space's
QEMU if it runs, puts the disk, spec and token in place (making the Space's directory if it
has none: a fork, or a lost Space), and starts QEMU with ``-incoming`` from the stream.

Both run as a job of their own (``python -m backends.microvm.machine_job``), in a session
of their own, that the caller waits for: a job that has begun ends as it would have,
whatever happens to the driver that asked (a driver killed between the stream's end and
``cont`` would leave its machine stopped for good, which no fault of the campaign means).
Jobs on one Space take its lock (``MicroVMSpaces._locked``), one at a time.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from durable.atomic_file import fsync_dir
from durable.errors import PermanentFailure, SpaceUnavailable

MEMORY, DISK, SPEC, TOKEN = "memory.zst", "disk.qcow2.zst", "machine.json", "token"
FILES = (MEMORY, DISK, SPEC, TOKEN)
#: How long a job may take (a save is about 0.5 s, a load 0.5 s plus the daemon's answer).
JOB_TIMEOUT_S = 300.0
#: Exit code of a job that failed for good (the state is damaged or its artifacts gone).
PERMANENT_EXIT = 3


def zstd() -> str:
    """The zstd program (whole-machine states are compressed with it)."""
    found = shutil.which("zstd")
    if found is None:
        raise PermanentFailure("whole-machine checkpoints are compressed with zstd, which is "
                               "not installed: apt-get install zstd (ci/microvm.sh does)")
    return found


def fsync_state(directory: Path) -> None:
    """Make a saved state durable: its files, then the directory."""
    for name in FILES:
        fd = os.open(directory / name, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    fsync_dir(directory)


def check_state(src: Path) -> None:
    """``PermanentFailure`` unless ``src`` holds a saved state whose artifacts are here."""
    missing = [f for f in FILES if not (src / f).is_file()]
    if missing:
        raise PermanentFailure(f"the saved machine state {src} lacks {missing}: it is damaged")
    artifacts = json.loads((src / SPEC).read_text())["artifacts"]
    gone = [p for p in (artifacts["kernel"], artifacts["initrd"], artifacts["disk"])
            if not Path(p).is_file()]
    if gone:
        raise PermanentFailure(f"the saved machine state {src} was taken with guest artifacts "
                               f"that are gone ({', '.join(gone)}); it cannot be started again")


def run_job(action: str, base_dir: Path, name: str, path: Path) -> None:
    """Run ``save_machine`` or ``load_machine`` of the Space ``name`` of the provider at
    ``base_dir`` as a job of its own (``machine_job``; see the module docstring) and wait
    for it. Its failure raises ``PermanentFailure`` (the state is
    damaged or cannot be used) or ``SpaceUnavailable`` (the machine went away meanwhile:
    the outcome is unknown)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "backends.microvm.machine_job", action, str(base_dir), name,
         str(path)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        start_new_session=True, env={**os.environ, "PYTHONPATH": _root_path()})
    try:
        _out, err = proc.communicate(timeout=JOB_TIMEOUT_S + 60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise SpaceUnavailable(f"the machine {action} job of Space {name} did not end within "
                               f"{JOB_TIMEOUT_S + 60:.0f} s; it was killed") from None
    if proc.returncode == 0:
        if err:  # what the job said on its way (a load started again): shown, not lost
            sys.stderr.write(err.decode(errors="replace"))
        return
    message = err.decode(errors="replace").strip().splitlines()
    reason = message[-1] if message else f"exit {proc.returncode}"
    if proc.returncode == PERMANENT_EXIT:
        raise PermanentFailure(reason)
    raise SpaceUnavailable(f"the machine {action} job of Space {name} failed: {reason}")


def _root_path() -> str:
    """This checkout's root first on the job's path (it runs this very code)."""
    root = str(Path(__file__).resolve().parents[2])
    rest = os.environ.get("PYTHONPATH")
    return root + (os.pathsep + rest if rest else "")
