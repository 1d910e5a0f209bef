"""The fast fixed-seed crash subset that gates CI: named slices of campaigns.

Each slice is a small campaign with fixed seeds (or an exhaustive slice of failpoints),
chosen so that together they reach every reachable cell of the adapter's recovery table
in each mode (``cells=N/N``), exercise every named check (G1-G5) on real faults, and stay
within a few minutes on two cores. ``chaos ci`` runs them (all, or ``--slice NAME``) and
prints one SUMMARY line per slice; the pytest marker ``crash_ci`` runs the same slices,
and the mutation gate (``tests/mutants``) runs, for each planted bug, the cheapest slice
that must catch it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

from chaos.campaign.campaign import CampaignConfig, ScriptedRun, run_campaign
from chaos.errors import BackendUnavailable
from chaos.faults.plans import HELD_KINDS, Action, Fault, FaultPlan, HeldAction
from scenarios import Step, generate, load


@dataclass(frozen=True)
class Slice:
    name: str
    #: What this slice is for, in one sentence.
    why: str
    #: ``CampaignConfig`` fields (mode, runs, steps, seed_base, preset, durable_mode, points).
    config: dict[str, Any] = field(default_factory=dict)
    #: Whether every reachable cell of its adapter mode must be reached.
    full_cells: bool = False
    #: Runs per job: a slice whose runs mostly wait (for a leftover writer's time) runs
    #: this many times as many at once.
    waits: int = 1
    #: A backend the slice needs that a machine may lack (its tests skip without it).
    needs: str | None = None

    @property
    def needs_root(self) -> bool:
        """Whether a held kind of its plans needs root to set up (a mount)."""
        return any(HELD_KINDS[a].root for a in self.config.get("held", ()))

    def campaign(self, results_root: Path, jobs: int, **overrides: Any) -> CampaignConfig:
        return replace(CampaignConfig(results_root=results_root, jobs=jobs * self.waits,
                                      **self.config), **overrides)


def _plan(seed: int, *faults: Fault, preset: str | None = None) -> ScriptedRun:
    return ScriptedRun(FaultPlan(seed, faults, 0.0, max_attempts=len(faults) + 4), preset)


#: On the ``ci-long`` agent, whose one command sleeps for seconds: the command still runs
#: when its driver dies (so the next driver's fence kills it) or when its daemon dies (so the
#: driver reattaches), however slow the machine is.
ACROSS_A_FAULT = (
    _plan(1, Fault("kill_driver", "failpoint", "space.running", 1), preset="ci-long"),
    _plan(1, Fault("kill_daemon", "failpoint", "space.running", 1, kill_driver=False),
          preset="ci-long"),
)
#: The same after auto's switch: ``ci-long-auto`` leaves a process running at its first
#: step, so its long command (bash call 2) runs in checkpoint mode.
ACROSS_A_FAULT_AFTER_SWITCH = (
    _plan(1, Fault("kill_driver", "failpoint", "space.running", 2), preset="ci-long-auto"),
    _plan(1, Fault("kill_daemon", "failpoint", "space.running", 2, kill_driver=False),
          preset="ci-long-auto"),
)


#: Hand-written plans for the ``ci-auto`` agent (steps 0-4 transactional; step 5 leaves a
#: process running, so the conversation switches to checkpoint mode there; its first
#: checkpoint follows at checkpoint.before#1), aimed at what seeds rarely reach: a Space
#: lost before the first checkpoint after the switch, and rebuilds cut short.
AUTO_PLANS = (
    # lost before the first checkpoint: a checkpoint-mode Space rebuilt from the image
    _plan(1, Fault("delete_space", "failpoint", "checkpoint.before", 1)),
    # ... and that rebuild cut short, then finished
    _plan(1, Fault("delete_space", "failpoint", "checkpoint.before", 1),
          Fault("kill_driver", "failpoint", "recovery.reimage", 1)),
    # a checkpoint-mode rebuild from a checkpoint cut short (step 6's result is committed)
    _plan(1, Fault("delete_space", "failpoint", "call.result", 7),
          Fault("kill_driver", "failpoint", "recovery.restore", 1)),
    # a transactional rebuild cut short (step 1's result is committed)
    _plan(1, Fault("delete_space", "failpoint", "call.result", 2),
          Fault("kill_driver", "failpoint", "recovery.reimage", 1)),
)

#: The agent of the exhaustive and targeted slices: seed 33 of the ci-commands preset writes
#: files/w0.txt, chmods it to 0600 (bash call 1), appends (bash 2), sleeps then appends
#: (bash 3), prints 80 KB (bash 4), calls a never-tool (call 6), fails with its own status
#: (bash 5), makes a tree (bash 6) and checksums files/w0.txt (bash 7). Wrapped calls 1-8
#: are every step but the never-tool.
COMMANDS_SEED = 33
COMMANDS: dict[str, Any] = {"preset": "ci-commands", "seed_base": COMMANDS_SEED}

#: Which calls reach each point, once per call, in a fault-free run (checkpoint-mode points
#: only in checkpoint mode).
_REACHED_BY: dict[str, Callable[[Step], bool]] = {
    "call.intent": lambda s: True, "call.result": lambda s: True,
    "space.start_mark": Step.touches_workspace, "space.outcome": Step.touches_workspace,
    "space.file_op": lambda s: s.tool in ("write", "edit"),
    "space.before_spawn": lambda s: s.tool == "bash", "space.exited": lambda s: s.tool == "bash",
    "spacesd.exec.exit_writing": lambda s: s.tool == "bash",
}


def table_runs(preset: str, seed: int, mode: str) -> tuple[ScriptedRun, ...]:
    """One scripted run per row of the recovery table that failpoints reach alone (no
    timing), on ``preset``'s agent: its first write and its first append are hit at the
    points that leave each kind of interrupted call (and a lost, then half-rebuilt, Space)
    behind. ``mode`` is the mode the agent's calls run in (checkpoint adds the adopted
    outcomes)."""
    scenario = generate(seed, load(preset))
    first = {s.kind: s for s in reversed(scenario.steps)}

    def at(point: str, kind: str) -> int:
        step = first[kind]
        return sum(1 for s in scenario.steps[:step.index + 1] if _REACHED_BY[point](s))

    def run(*faults: tuple[Action, str, str, bool] | Fault) -> ScriptedRun:
        made = [f if isinstance(f, Fault) else
                Fault(f[0], "failpoint", f[1], at(f[1], f[2]), kill_driver=f[3])
                for f in faults]
        return _plan(seed, *made, preset=preset)

    rebuild_point = "recovery.restore" if mode == "checkpoint" else "recovery.reimage"
    runs = [
        run(("kill_driver", "call.intent", "write", True)),          # ran file no_start_mark
        run(("kill_driver", "call.intent", "append", True)),         # ran bash no_start_mark
        run(("kill_driver", "space.before_spawn", "append", True)),  # ran bash key_unknown
        run(("kill_driver", "space.exited", "append", True)),        # replayed bash exited
        run(("kill_process", "spacesd.exec.exit_writing", "append", False)),  # daemon_lost
        run(("delete_space", "space.exited", "append", True)),       # bash space_lost
        run(("kill_driver", "space.file_op", "write", True)),        # file file_cut
        run(("delete_space", "space.file_op", "write", True)),       # file space_lost
        run(("delete_space", "call.result", "write", True)),         # space rebuilt: space_lost
        run(("delete_space", "call.result", "write", True),          # ... cut short: unfinished
            Fault("kill_driver", "failpoint", rebuild_point, 1)),
    ]
    if mode == "checkpoint":
        runs += [run(("kill_driver", "space.outcome", "write", True)),   # adopted file
                 run(("kill_driver", "space.outcome", "append", True))]  # adopted bash
    return tuple(runs)


#: Hand-written plans for that agent (checkpoint mode), each for one situation.
TARGETED = (
    # a command that started in a Space lost before its outcome was recorded: never again
    _plan(COMMANDS_SEED, Fault("kill_driver", "failpoint", "space.exited", 2),
          Fault("delete_space", "failpoint", "recovery.begin", 1)),
    # an outcome adopted after a crash before its checkpoint (wrapped call 3, the append),
    # then an unknown outcome (the long command's shim dies): the restore must keep it
    _plan(COMMANDS_SEED, Fault("kill_driver", "failpoint", "checkpoint.before", 3),
          Fault("kill_process", "failpoint", "spacesd.exec.exit_writing", 3,
                kill_driver=False)),
    # the chmod's shim dies before its exit is recorded (outcome unknown), and the Space
    # restarts in the middle of the restore that undoes it: the next restore converges
    _plan(COMMANDS_SEED, Fault("kill_process", "failpoint", "spacesd.exec.exit_writing", 1,
                kill_driver=False),
          Fault("restart_space", "failpoint", "spacesd.restore.partial", 1)),
    # the long command's shim dies before its exit is recorded (outcome unknown) while the
    # first command's background job runs on: the driver restores in the middle of its run,
    # at its own epoch, and must end its own job before the restore (G3)
    _plan(1, Fault("kill_process", "failpoint", "spacesd.exec.exit_writing", 2,
                   kill_driver=False), preset="ci-long-auto"),
)

#: Power cuts while the ci-power agent's command sleeps, its append fsynced: once the
#: command printed (it prints after its fsync), with the driver killed too or meeting the
#: machine's reboot itself.
POWER_CUTS = tuple(
    _plan(1, Fault("power_loss", "failpoint", "space.running", 1, kill_driver=kill,
                   after_output=True), preset="ci-power")
    for kill in (True, False))

#: The Space's clock stepped a year forward while the ci-long agent's command sleeps, its
#: driver killed there: the next driver's recovery asks the ledger about the command while
#: the Space's clock reads a year on, and must learn that it started.
CLOCK_JUMPS = (_plan(1, Fault("jump_clock", "failpoint", "space.running", 1, hold=10.0,
                              jump=365 * 86400.0), preset="ci-long"),)
#: On the ``ci-shapes`` agent (steps 0-7 make every shape, step 8 is the first write): the
#: write cut at its file operation (revert or restore, then rerun), the Space lost after the
#: write's result (rebuilt from the image or the store), and both cut short once more.
SHAPES_PLANS = tuple(
    _plan(1, *faults, preset="ci-shapes") for faults in (
        (Fault("kill_driver", "failpoint", "space.file_op", 1),),
        (Fault("delete_space", "failpoint", "call.result", 9),),
        (Fault("restart_space", "failpoint", "space.file_op", 1),
         Fault("kill_driver", "failpoint", "recovery.decided", 1)),
        (Fault("delete_space", "failpoint", "call.result", 9),
         Fault("kill_daemon", "failpoint", "spacesd.restore.partial", 1, kill_driver=False)),
    ))
def _held_plans(action: HeldAction, points: tuple[tuple[str, str | None], ...] = (
        ("space.file_op", None), ("spacesd.exec.recorded", None), ("space.running", "ci-long"))
                ) -> tuple[ScriptedRun, ...]:
    """A held fault past the drivers' request timeout (2 s; a request is sent twice, so 5 s
    leaves it unanswered), at each of ``points`` (with the preset it needs): by default from
    a file call's write, from inside the daemon's start of a command, and while a command
    runs."""
    return tuple(_plan(1, Fault(action, "failpoint", point, 1, kill_driver=False, hold=5.0),
                       preset=preset)
                 for point, preset in points)


#: A frozen Space: a write lands after the driver gave up on it, a start and a command
#: wait frozen. A cut link: the daemon carries out a start whose answer is lost, a write
#: held by the cut never arrives, a command ends while its driver cannot see it. A slow
#: link: the same requests given up on by their driver still arrive, late; and a write
#: arrives after its driver's own recovery reverted it, ran it again and removed its file
#: while that driver still runs (``ci-late-write``: slowed 12 s, far past the two sends
#: and the health checks after them).
PAUSES, CUTS = _held_plans("pause_space"), _held_plans("cut_link")
SLOWDOWNS = (*_held_plans("slow_link"),
             _plan(1, Fault("slow_link", "failpoint", "space.file_op", 1, kill_driver=False,
                            hold=5.0, slow=12.0), preset="ci-late-write"))
#: A command frozen (its daemon answering) just spawned, while it runs and while its shim
#: writes its exit: a wait must see it running, never ended or lost.
COMMAND_PAUSES = _held_plans("pause_commands", (
    ("spacesd.exec.spawned", None), ("space.running", "ci-long"),
    ("spacesd.exec.exit_writing", "ci-long")))
#: A full state disk when a command prints, gone before it exits: its output must end with
#: spacesd's line saying from which byte it was lost (the only plan that reaches that line).
STATE_DISK_OUTPUT = _held_plans("fill_state_disk", (("space.running", "ci-late-print"),))
#: The bundled workload every machine can run (no program beyond bash and coreutils).
ODD_OBJECTS = str(Path(__file__).resolve().parents[2] / "scenarios" / "workloads" /
                  "odd-objects.yaml")

SLICES: tuple[Slice, ...] = (
    Slice("transactional", "transactional recovery under every fault kind, combined ones too",
          {"mode": "transactional", "steps": 8, "seeds": (5, 34, 47, 77, 110),
           "plans": table_runs("ci-commands", COMMANDS_SEED, "transactional")
           + ACROSS_A_FAULT},
          full_cells=True),
    Slice("checkpoint", "checkpoint recovery under every fault kind, combined ones too",
          {"mode": "checkpoint", "steps": 8, "seeds": (66, 78, 97, 107, 119),
           "plans": table_runs("ci-commands", COMMANDS_SEED, "checkpoint") + ACROSS_A_FAULT},
          full_cells=True),
    Slice("auto", "auto mode's switch, with faults before and after it and during rebuilds",
          {"mode": "auto", "preset": "ci-auto",
           "seeds": (2, 8, 20, 31, 49),
           "plans": AUTO_PLANS + ACROSS_A_FAULT + ACROSS_A_FAULT_AFTER_SWITCH
           + table_runs("ci-commands", COMMANDS_SEED, "transactional")
           + table_runs("ci-commands-auto", COMMANDS_SEED, "checkpoint")},
          full_cells=True),
    Slice("stale", "an older driver parked mid-call is fenced and changes nothing, whether it "
          "resumes after the newer one finished or right after it opened the log",
          {"mode": "stale", "steps": 5, "seeds": (7, 6, 8, 21, 3, 1)}),
    Slice("stale-jsonl", "the same on the JSONL log and its file fence: a parked older "
          "driver's commits are refused once a newer one opened the log",
          {"mode": "stale", "steps": 5, "seeds": (7, 6, 8, 21, 3, 1), "log_storage": "jsonl"}),
    Slice("stale-paused", "an older driver paused (SIGSTOP) wherever it is a few milliseconds "
          "past a seeded point, overtaken by a newer one that finishes, then woken: it must "
          "be fenced and change nothing", {"mode": "stale", "stale_kind": "paused", "runs": 10}),
    Slice("stale-foreign", "a second session on the same Spaces provider: another one beside "
          "the run's, or a new log of this session on the Space an earlier log left a command "
          "running in at the same epoch", {"mode": "stale", "stale_kind": "foreign", "steps": 5,
                                           "runs": 20}, waits=3),
    Slice("stale-detached", "an older driver overtaken while its command left a writer in a "
          "session of its own: the newer driver's fence must kill the writer too",
          {"mode": "stale", "stale_kind": "detached", "runs": 20}, waits=4),
    Slice("redrive", "the coordinator drives the session through driver kills, Spaces lost "
          "after a kill and under a live driver, its own SIGKILL in a backoff, a race of "
          "two sessions for one Space, a driver frozen mid-call that it must replace, and "
          "one frozen with its coordinator that another coordinator must take over",
          {"mode": "redrive", "runs": 12}),
    Slice("stale-held", "the stale race under held faults that open once the older driver is "
          "parked: the racing drivers' Space frozen, their link cut, their commands frozen; "
          "the older must still change nothing and never finish the session",
          {"mode": "stale", "steps": 5, "held": ("pause_space", "cut_link", "pause_commands"),
           "seeds": (3, 9, 12, 2, 15, 14)}),
    Slice("redrive-held", "the same coordinator under held faults: its Space frozen while a "
          "drive reads the floor and while commands run, the link cut, the daemon frozen; "
          "a drive held up past a claim must keep it, and no epoch may be driven twice",
          {"mode": "redrive", "held": ("pause_space", "cut_link", "pause_daemon"),
           "seeds": (4, 5, 9, 13, 16, 22)}),
    Slice("redrive-host-power", "the coordinator's host losing power at seeded driver "
          "points: its coordinators and drivers killed, the log keeping what reached its "
          "disk; the coordinators boot again and each takes its sessions back, finds the "
          "driver gone and drives on above its epoch (G6, G7)",
          {"mode": "redrive", "held": ("cut_host_power",), "seeds": (1, 2, 3, 4, 5, 6)}),
    Slice("stale-host-power", "the drivers' host losing power while an older driver is "
          "parked and a newer one runs (or the older one, woken, meets its fence): both die "
          "at once, the log keeps what reached its disk (G7), and the session's next driver "
          "goes on from it, the older one's parked step changing nothing (G4)",
          {"mode": "stale", "held": ("cut_host_power",), "seeds": (1, 2, 3, 4, 5, 6)}),
    Slice("pause-spaces", "a Space frozen (every process stopped) past the drivers' request "
          "timeout, at seeded points and where a request is left unanswered: what it does "
          "once thawed must match what the log says",
          {"mode": "transactional", "held": ("pause_space",), "seeds": (1, 2, 3, 5, 6, 8),
           "plans": PAUSES}),
    Slice("cut-links", "the link between the drivers and the Space cut (a partition: the "
          "daemon carries out what reached it, its answers are lost) past the drivers' "
          "request timeout, at seeded points and where a request is in the daemon",
          {"mode": "checkpoint", "held": ("cut_link",), "seeds": (1, 2, 3, 5), "plans": CUTS}),
    Slice("slow-links", "the link between the drivers and the Space slowed past the drivers' "
          "request timeout: a write they gave up on reaching the daemon late, the answer to "
          "a start already in the daemon late, a command's waits slowed, a write arriving "
          "after its driver's recovery, and seeded points",
          {"mode": "transactional", "held": ("slow_link",), "seeds": (1, 2, 3, 5),
           "plans": SLOWDOWNS}),
    Slice("pause-commands", "a Space's commands frozen (every process of them stopped) while "
          "its daemon answers, past the drivers' request timeout: the command just spawned, "
          "running and writing its exit; its key must read running until it ends, never "
          "ended or lost, and nothing may start it again",
          {"mode": "checkpoint", "held": ("pause_commands",), "seeds": (1, 2, 3, 4),
           "plans": COMMAND_PAUSES}),
    Slice("state-disk", "the disk of the daemon's own state full (its ledger, journals, "
          "command output and checkpoints meet ENOSPC; the workspace keeps its room) at "
          "seeded points and inside a write, a start and a running command: what the daemon "
          "refused or cut short must leave the log and the Space consistent",
          {"mode": "checkpoint", "held": ("fill_state_disk",), "seeds": (1, 2, 3, 4, 5, 6),
           "plans": _held_plans("fill_state_disk") + STATE_DISK_OUTPUT}),
    Slice("work-disk", "the workspace's own disk full (a volume's: writes, edits, commands and "
          "restores meet ENOSPC; the daemon's state keeps its room) at seeded points and "
          "inside a write, a start and a running command: a write or an edit that met it "
          "must fail whole, a command must say so in its result",
          {"mode": "checkpoint", "held": ("fill_work_disk",), "seeds": (1, 2, 3, 4, 5, 6),
           "plans": _held_plans("fill_work_disk")}),
    Slice("log-disk", "the disk of the drivers' JSONL log full (an append cut short where it "
          "stands) from a file call's write, inside a start and while a command runs: a "
          "commit that did not land whole must fail, and the next driver must read the log "
          "as it was",
          {"mode": "checkpoint", "held": ("fill_log_disk",), "seeds": (1, 2, 3, 4, 5, 6),
           "log_storage": "jsonl", "plans": _held_plans("fill_log_disk")}),
    Slice("host-power", "the drivers' host losing power at seeded driver points (every "
          "driver killed, the SQLite log keeping only what reached its disk), then booting: "
          "every commit that had returned must still be in the log (G7), and the next driver "
          "must go on from it",
          {"mode": "transactional", "held": ("cut_host_power",), "seeds": (1, 2, 3, 4, 5, 6)}),
    Slice("host-power-jsonl", "the same power cuts under the JSONL log and its file fence",
          {"mode": "checkpoint", "held": ("cut_host_power",), "seeds": (1, 2, 3, 4, 5, 6),
           "log_storage": "jsonl"}),
    Slice("forks-transactional", "an agent that forks its conversation at a seeded step's "
          "result and plays the rest again in the fork, under faults: the fork's Space must "
          "start from the log's image as of that result",
          {"mode": "transactional", "preset": "forks", "seeds": (1, 2, 3, 4, 5, 6)}),
    Slice("forks-checkpoint", "the same in checkpoint mode: the fork's Space must start from "
          "its parent's checkpoint of that result",
          {"mode": "checkpoint", "preset": "forks", "seeds": (1, 2, 3, 4, 5, 6)}),
    Slice("microvm-power", "power cuts of a microVM Space while a command that fsynced its "
          "append runs: the next driver must learn from the ledger that it ran",
          {"mode": "transactional", "backend": "microvm", "plans": POWER_CUTS},
          needs="microvm"),
    Slice("microvm-clock", "a microVM Space's clock stepped a year forward while a command "
          "runs and its driver is killed: nothing that decides the recovery may read the "
          "Space's clock",
          {"mode": "transactional", "backend": "microvm", "held": ("jump_clock",),
           "plans": CLOCK_JUMPS}, needs="microvm"),
    Slice("exhaustive-daemon", "a fault at every point inside the daemon and the shims "
          "(each command of the ci-commands agent), then one during recovery",
          {"mode": "exhaustive", "durable_mode": "checkpoint", **COMMANDS,
           "points": ("spacesd.exec.recorded", "spacesd.exec.spawned",
                      "spacesd.exec.exit_writing")}),
    Slice("exhaustive-transactional", "a fault at every occurrence of the command and file "
          "points in transactional mode, then one during recovery",
          {"mode": "exhaustive", "durable_mode": "transactional", **COMMANDS,
           "points": ("space.running", "space.exited", "space.file_op",
                      "spacesd.exec.exit_writing")}),
    Slice("exhaustive-files", "a kill before and after every file call's change reached the "
          "Space (before its outcome was recorded): an edit whose write landed must not be "
          "applied twice, then one fault during recovery",
          {"mode": "exhaustive", "durable_mode": "transactional", "preset": "ci-auto",
           "seed_base": 1, "points": ("space.file_op", "space.file_written")}),
    Slice("exhaustive-calls", "a kill after every call's tool returned, after every "
          "command exited and after every outcome was recorded, in checkpoint mode",
          {"mode": "exhaustive", "durable_mode": "checkpoint", **COMMANDS,
           "points": ("call.returned", "space.exited", "space.outcome")}),
    Slice("virtual", "a kill at every failpoint of an agent on a virtual workspace (its files in "
          "the log, a blob beside it), then one during the call's rerun",
          {"mode": "exhaustive", "backend": "virtual", "preset": "virtual-small"}),
    Slice("targeted", "hand-written combined faults on the ci-commands agent where a wrong "
          "recovery would hide", {"mode": "checkpoint", **COMMANDS, "plans": TARGETED}),
    Slice("shapes-transactional", "every shape real programs leave (empty directories, "
          "FIFOs, hardlinks, absolute links, odd names, sparse files, set mtimes, set-id bits) "
          "through a revert and a rebuild from the log's image",
          {"mode": "transactional", "plans": SHAPES_PLANS}),
    Slice("shapes-checkpoint", "the same shapes through a restore and a rebuild from the "
          "checkpoint store", {"mode": "checkpoint", "plans": SHAPES_PLANS}),
    Slice("workload", "a user's workload (odd file-system objects made by real bash) checked "
          "against its golden run under seeded faults",
          {"mode": "checkpoint", "preset": f"workload:{ODD_OBJECTS}", "runs": 4}),
)
BY_NAME = {s.name: s for s in SLICES}


def run_slices(names: list[str], *, results_root: Path, jobs: int, stop_on_failure: bool,
               out: TextIO = sys.stdout) -> int:
    """Run the named slices (all when empty; names checked by the caller); the exit code is
    the worst of theirs."""
    codes: list[int] = []
    for s in [BY_NAME[n] for n in names] or list(SLICES):
        print(f"slice {s.name}: {s.why}", file=out, flush=True)
        if s.needs_root and os.geteuid() != 0:
            if names:
                raise BackendUnavailable(f"slice {s.name} needs root (a mount); run it as "
                                         "root")
            print(f"slice {s.name}: skipped, it needs root (a mount)", file=out, flush=True)
            continue
        try:
            codes.append(run_campaign(s.campaign(results_root / s.name, jobs,
                                                 stop_on_failure=stop_on_failure), out))
        except BackendUnavailable as exc:
            if names or s.needs is None:
                raise  # asked for by name, or a backend every machine has: an error
            print(f"slice {s.name}: skipped, the {s.needs} backend cannot run here: {exc}",
                  file=out, flush=True)
            continue
        if codes[-1] and stop_on_failure:
            break
    return 1 if 1 in codes else max(codes)  # invalid beats unknown beats valid
