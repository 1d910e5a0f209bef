"""Machine mode (``CRASH_MODE=machine``, microvm only): whole-machine checkpoints keep their
promise. Each run starts a counting process in a fresh microVM Space, checkpoints the
machine, writes a file and lets the count go on, injures the machine (by seed: nothing, a
daemon kill, a clean restart, or a power cut that leaves it off, so the restore boots it
from the checkpoint), restores the checkpoint, and checks (``M1``):

- the process is back with the same pid, still running under its key;
- its count is exactly the checkpoint's, not the later one, and goes on from there (the
  process is stopped while the machine is checkpointed, so the check does not depend on
  how long a save or a restore takes);
- the file written after the checkpoint is gone, the one written before it is there.

Timings are drawn from the seed, so ``chaos repro`` runs the same plan again.
"""

from __future__ import annotations

import random
import shutil
import time
import traceback
from typing import TYPE_CHECKING, Any, cast

from chaos.checks.model import Verdict
from chaos.faults.plans import FaultPlan
from chaos.run.record import RunRecord

if TYPE_CHECKING:
    from backends.microvm import MicroVMSpaces
    from chaos.run.context import RunContext

INJURIES = ("none", "kill_daemon", "restart", "power_off")
# /tmp/count is replaced whole (a rename), so a stop between a truncation and its write
# never leaves it empty
COUNTER = ("echo $$ > /tmp/counter.pid; i=0; while true; do i=$((i + 1)); "
           "echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep {interval}; done")


def _read(client: Any, key: str, command: str) -> str:
    client.exec_start(key, command)
    info = client.exec_wait(key)
    if info.state != "exited" or info.exit_code != 0:
        raise RuntimeError(f"{command!r} ended {info.state} {info.exit_code}: {info.output}")
    return str(info.output).strip()


def run_machine_check(run: RunContext) -> RunRecord:
    spec, state = run.spec, run.state
    rng = random.Random(f"machine:{spec.seed}")
    interval = rng.choice((0.05, 0.1, 0.2))
    before, after = round(rng.uniform(0.5, 2.0), 2), round(rng.uniform(1.0, 3.0), 2)
    injury = rng.choice(INJURIES)
    errors: list[str] = []
    facts: dict[str, Any] = {"interval": interval, "before_s": before, "after_s": after,
                             "injury": injury}
    spaces: MicroVMSpaces | None = None
    try:
        from backends.microvm import SandboxSnapshots
        from chaos.space_providers import backend, make_spaces

        if not backend(spec.backend).machines:
            raise ValueError("machine mode needs --backend microvm (whole-machine "
                             "checkpoints)")
        run.dir.mkdir(parents=True, exist_ok=True)
        spaces = cast("MicroVMSpaces", make_spaces(spec.backend, run.dir))
        snaps = SandboxSnapshots(spaces)
        name = "machine"
        spaces.create(name)
        client = spaces.connect(name, epoch=1)
        client.write_file("before.txt", b"written before the checkpoint\n")
        client.exec_start("counter@1", COUNTER.format(interval=interval))
        time.sleep(before)
        pid = _read(client, "pid-0@1", "cat /tmp/counter.pid")
        _read(client, "stop-0@1", f"kill -STOP {pid}")
        at_checkpoint = int(_read(client, "read-0@1", "cat /tmp/count"))
        state.op("nemesis", "info", "checkpoint", {"id": "m1"})
        snaps.checkpoint(name, "m1")
        client.write_file("after.txt", b"written after the checkpoint\n")
        _read(client, "cont-0@1", f"kill -CONT {pid}")
        time.sleep(after)
        later = int(_read(client, "read-1@1", "cat /tmp/count"))
        state.op("nemesis", "info", injury, None)
        if injury == "kill_daemon":
            spaces.kill_daemon(name)
            state.count("daemon_kills")
        elif injury == "restart":
            spaces.restart(name)
            state.count("space_restarts")
        elif injury == "power_off":
            spaces.power_off(name)
            state.count("power_losses")
        state.op("nemesis", "info", "restore", {"id": "m1"})
        snaps.restore_space(name, "m1")
        restored = int(_read(client, "read-2@1", "cat /tmp/count"))
        pid_after = _read(client, "pid-2@1", "cat /tmp/counter.pid")
        _read(client, "cont-2@1", f"kill -CONT {pid_after}")
        deadline = time.monotonic() + 60
        counted_on, attempt = restored, 0
        while counted_on <= restored and time.monotonic() < deadline:
            time.sleep(interval)
            attempt += 1
            counted_on = int(_read(client, f"read-3-{attempt}@1", "cat /tmp/count"))
        facts.update(at_checkpoint=at_checkpoint, later=later, restored=restored, pid=pid,
                     pid_after=pid_after, counted_on=counted_on)
        if pid_after != pid:
            errors.append(f"M1 machine: the counting process came back as pid {pid_after}, "
                          f"not {pid}")
        if client.exec_status("counter@1").state != "running":
            errors.append("M1 machine: the counting process's key is not running after the "
                          "restore")
        if not restored == at_checkpoint < later:
            errors.append(f"M1 machine: the count came back as {restored}; at the checkpoint "
                          f"it was {at_checkpoint} and later {later}: not the checkpoint's")
        if counted_on <= restored:
            errors.append(f"M1 machine: the restored process, continued, did not count on "
                          f"from {restored} within 60 s")
        if client.stat("after.txt") is not None:
            errors.append("M1 machine: after.txt, written after the checkpoint, is still there")
        if client.stat("before.txt") is None:
            errors.append("M1 machine: before.txt, written before the checkpoint, is gone")
        verdict = Verdict(not errors, errors, ["M1"] if errors else [])
    except Exception as exc:  # noqa: BLE001 - the run itself broke: unknown, with the reason
        verdict = Verdict("unknown", [f"run crashed: {type(exc).__name__}: {exc}",
                                      traceback.format_exc(limit=6)])
    finally:
        if spaces is not None:
            for n in spaces.names():
                spaces.delete(n)
    state.op("checker", "info", "machine", facts)
    failed = verdict.valid is not True
    if not failed and not spec.keep:
        shutil.rmtree(run.dir, ignore_errors=True)
    return RunRecord(
        index=spec.index, seed=spec.seed, campaign_mode=spec.campaign_mode, stale_kind=None,
        durable_mode=spec.durable_mode, backend=spec.backend, preset=spec.preset, steps=0,
        plan=FaultPlan(spec.seed, ()), history=state.history(), recoveries=[],
        counts={**state.counts(), "machine_checks": 1}, latencies=[], points_hit={},
        final_exit=None, fired=[], verdict=verdict, observation=None,
        seconds=round(time.time() - state.t0, 3), started_at=state.t0,
        run_dir=str(run.dir) if failed or spec.keep else None, interrupted=False)
