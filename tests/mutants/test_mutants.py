"""The mutation gate: realistic one-line bugs planted in the system under test, each of which
the fast CI subset must catch.

Each mutant is a small textual patch (exact text that must occur once, and its
replacement) with one sentence on what it breaks. ``pytest -m mutants`` copies the project
into a temporary directory per mutant, applies the patch there, and runs the CI slice that
must catch it (``python -m chaos ci --slice NAME``, the same slices as ``pytest -m
crash_ci``) with the copy first on the path: drivers and Space daemons are started from the
copy. A mutant the slice calls valid has *survived*: the gate fails and says which check
should have caught it. The score line (``MUTATION SCORE k/n``) is printed at the end.

A mutant whose text no longer occurs in the code fails too (the code moved: update the
mutant, never drop it silently).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("durable", "spacesd", "backends", "chaos", "scenarios", "ci")
SLICE_TIMEOUT_S = 600


@dataclass(frozen=True)
class Mutant:
    id: str
    path: str
    #: (exact text that occurs once in ``path``, its replacement), applied in order.
    edits: tuple[tuple[str, str], ...]
    #: What it breaks, in one sentence.
    breaks: str
    #: The CI slice that must catch it (``chaos.campaign.ci_subset.SLICES``).
    slice: str
    #: The check that should catch it, and the recovery-table cell (or fault) it hides in.
    check: str
    where: str


#: The ledger's start record and the spawn's failpoint, as they stand in exec_ledger.py.
RECORD = ('            self._journal.append({"t": "start", "key": key, "id": rec.id, '
          '"command": command,\n'
          '                                  "cwd": cwd, "epoch": epoch, "ms": rec.started_ms,\n'
          '                                  "life": self._life})\n'
          '            self._failpoints.report("spacesd.exec.recorded", {"key": key, '
          '"epoch": epoch})\n')
SPAWNED = ('            self._failpoints.report("spacesd.exec.spawned",\n'
           '                                    {"key": key, "epoch": epoch, "shim_pid": pid})\n')

MUTANTS: tuple[Mutant, ...] = (
    # ---------------------------------------------------------------- virtual workspaces
    Mutant(
        "virtual-change-before-result", "durable/virtual/workspace.py",
        (("            ctx.record_before_result(lambda tx: tx.append(ctx.conversation, "
          "\"system\", data))\n",
          "            ctx.commit_now(lambda tx: tx.append(ctx.conversation, \"system\", "
          "data))\n"),),
        "a virtual workspace's call commits its change to the files right away instead of "
        "with its result, so a crash between the two leaves the change in the log and the "
        "call, replay-safe, runs again on top of it",
        "virtual", "G1", "a kill at call.returned of an appending command"),
    # ---------------------------------------------------------------- spacesd
    Mutant(
        "ledger-record-after-spawn", "spacesd/exec_ledger.py",
        ((RECORD, ""), (SPAWNED, SPAWNED + RECORD)),
        "the start record is written after the spawn, so a daemon that dies in between "
        "forgets a command that runs",
        "exhaustive-daemon", "G1", "ran bash key_unknown after a daemon kill at exec.spawned"),
    Mutant(
        "ledger-record-not-synced", "spacesd/journal.py",
        (("                os.fdatasync(self._fd)\n",
          "                if record.get(\"t\") != \"start\":\n"
          "                    os.fdatasync(self._fd)\n"),),
        "the ledger's start record is not fsynced before the command is spawned, so a power "
        "cut while the command runs can lose the record of a command whose writes reached "
        "the disk, and it runs again",
        "microvm-power", "G1", "a power cut while a command that fsynced its append sleeps"),
    Mutant(
        "known-exited-key-restarted", "spacesd/exec_ledger.py",
        (("            if rec is not None:\n                if (rec.command, rec.cwd)",
          "            if rec is not None and self._state(rec).state == \"running\":\n"
          "                if (rec.command, rec.cwd)"),),
        "starting a key the ledger knows runs its command again once the first run "
        "exited, as when a client retries its start through a daemon restart",
        "exhaustive-daemon", "G2", "a start retried after the daemon died at exec.spawned"),
    Mutant(
        "journal-drops-last-record", "spacesd/journal.py",
        (("    lines = raw[:end].split(b\"\\n\")[:-1]\n",
          "    lines = raw[:end].split(b\"\\n\")[:-2]\n"),),
        "reopening the ledger drops its last complete record as if it were torn, so a "
        "restarted daemon forgets the newest key and it runs again",
        "exhaustive-daemon", "G1", "ran bash key_unknown after a daemon restart"),
    Mutant(
        "replay-tail-too-short", "spacesd/protocol.py",
        (("OUTPUT_TAIL_BYTES = 64 * 1024", "OUTPUT_TAIL_BYTES = 40 * 1024"),),
        "the ledger keeps and replays only 40 KiB of an ended command's output, less than "
        "the 50 KiB a result shows",
        "exhaustive-calls", "G5", "replayed bash exited (the 80 KB command)"),
    Mutant(
        "advance-kills-nothing", "spacesd/daemon.py",
        (("            killed = self.ledger.fence(epoch, own=done.own)\n",
          "            killed = []\n"),),
        "advance_epoch raises the floor but leaves the older epoch's commands running",
        "transactional", "G3", "reverted bash fenced (the ci-long command across a kill)"),
    Mutant(
        "recovery-spares-its-own-processes", "durable/adapter/recovery.py",
        tuple((f"    def {name}(self, call: Interrupted, decision: Decision) -> ToolResult:\n"
               "        self.space.refence(call.handle.client, own=True)\n",
               f"    def {name}(self, call: Interrupted, decision: Decision) -> ToolResult:\n")
              for name in ("_revert", "_restore")),
        "a driver that reverts or restores the workspace in the middle of its run (a "
        "command's shim died) keeps its epoch and does not fence its own earlier processes, "
        "so a background job of an earlier call outlives the restore",
        "targeted", "G3", "restored bash daemon_lost in-process, a background job alive"),
    Mutant(
        "floor-not-persisted", "spacesd/epoch_fence.py",
        (("                self._persist(after)\n", "                pass\n"),),
        "advance_epoch never raises the Space's floor, so nothing stale is ever refused",
        "checkpoint", "G3", "restored: a restore by an epoch above the floor"),
    Mutant(
        "restore-keeps-extra-files", "spacesd/checkpoints.py",
        (("            if wanted is None or wanted.kind != paths.kind_of(st.st_mode):",
          "            if wanted is not None and wanted.kind != paths.kind_of(st.st_mode):"),),
        "a checkpoint restore keeps files the checkpoint does not have",
        "exhaustive-daemon", "G1", "restored: a command's new file left behind"),
    Mutant(
        "restore-ignores-modes", "spacesd/checkpoints.py",
        ((" " * 70 + "or now.mode != e.mode):",
          " " * 70 + "or False):"),),
        "a restore leaves a file whose content is right but whose mode changed",
        "exhaustive-daemon", "G1", "restored bash daemon_lost after the chmod's shim died"),
    Mutant(
        "ledger-keys-expire-by-the-clock", "spacesd/exec_ledger.py",
        (("        rec = self._records.get(key)\n        if rec is None:\n"
          "            return ExecInfo(key=key, state=\"unknown\")\n"
          "        st = self._state(rec)\n",
          "        rec = self._records.get(key)\n"
          "        if rec is not None and _now_ms() - rec.started_ms > 86_400_000:\n"
          "            rec = None  # a day old: expired, as an idempotency cache's keys are\n"
          "        if rec is None:\n"
          "            return ExecInfo(key=key, state=\"unknown\")\n"
          "        st = self._state(rec)\n"),),
        "the ledger forgets a key recorded more than a day ago by the Space's clock (to bound "
        "its size, as an idempotency cache expires its keys), so a clock stepped forward "
        "makes a command that started read as never started, and recovery starts it again "
        "(only a clock jump shows it)",
        "microvm-clock", "G2", "jump_clock while a command runs, its driver killed"),
    # ---------------------------------------------------------------- pauses and cut links
    Mutant(
        "timeout-reported-as-the-tools-error", "durable/adapter/space_env.py",
        (("    if isinstance(exc, (SpaceUnavailable, SpaceNotFound)):\n",
          "    if isinstance(exc, SpaceUnavailable) and isinstance(exc.__cause__, TimeoutError):\n"
          "        return ToolError(f\"the Space did not answer in time: {exc}\")\n"
          "    if isinstance(exc, (SpaceUnavailable, SpaceNotFound)):\n"),),
        "a request the Space did not answer in time is reported to the model as the tool's "
        "error, though its outcome is unknown: a write a frozen daemon makes once thawed is "
        "recorded as a call that failed",
        "pause-spaces", "G5", "a write whose Space froze past the request timeout"),
    Mutant(
        "stopped-command-read-as-lost", "spacesd/exec_ledger.py",
        (("                procfs.is_alive(claim.pid, claim.started):\n",
          "                procfs.is_alive(claim.pid, claim.started) and \\\n"
          "                (procfs._stat_fields(claim.pid) or [\"T\"])[0] != \"T\":\n"),),
        "the ledger takes a stopped shim (SIGSTOP, a debugger, a frozen cgroup) for a dead one, "
        "as a liveness test that only counts running and sleeping processes does: a command "
        "frozen while its daemon answers reads lost, and the driver restores and reruns it "
        "or tells the agent it was interrupted, though it was only waiting to go on",
        "pause-commands", "G5", "a command frozen just spawned, running and writing its exit"),
    Mutant(
        "own-fence-admits-earlier-requests", "spacesd/daemon.py",
        (("        with self.fence.admit(epoch, sent_round):\n"
          "            return spec.handler(**args)\n",
          "        with self.fence.admit(epoch):\n"
          "            return spec.handler(**args)\n"),),
        "a driver's own fence (before it reverts or restores in the middle of its run) "
        "admits the requests it sent before (their round is not checked), so a write it gave "
        "up on that a slow link delivers after the recovery lands over the workspace the "
        "recovery put back (only a slow link delivers a request that late: a pause delivers "
        "it at the thaw, before the recovery; a cut never)",
        "slow-links", "G1", "reverted write file_cut, then its write delivered late"),
    Mutant(
        "write-timeout-taken-as-done", "durable/adapter/runner.py",
        (("            data = args[\"content\"].encode(\"utf-8\")\n"
          "            client.write_file(path, data)\n",
          "            data = args[\"content\"].encode(\"utf-8\")\n"
          "            try:\n"
          "                client.write_file(path, data)\n"
          "            except SpaceUnavailable as exc:  # the bytes were sent\n"
          "                if not isinstance(exc.__cause__, TimeoutError):\n"
          "                    raise\n"),),
        "a write whose answer did not come in time is taken as done (its bytes were sent and "
        "a write is idempotent), though a cut link never delivered it: the log says written, "
        "the file is not there (a pause delivers it late, so only a cut shows it)",
        "cut-links", "G1", "a write sent into a cut link"),
    # ---------------------------------------------------------------- forks
    Mutant(
        "fork-misses-its-calls-image", "durable/tools.py",
        (("        self._records.append(hook)\n",
          "        self._hooks.append(lambda tx, _entry: hook(tx))\n"),),
        "a call's record of the workspace it left (its image change) is committed after its "
        "result again, so a conversation forked at the result lacks that call's own change",
        "forks-transactional", "G1", "a fork's Space rebuilt from the image as of its entry"),
    Mutant(
        "fork-reads-the-checkpoint-before", "durable/log.py",
        (("        at = batch.base_id if batch.next_id > batch.base_id else batch.base_id - 1\n",
          "        at = batch.next_id - 1\n"),),
        "a transaction's documents are read as of its last entry again, so a fork at a "
        "result (followed by its recovery events) reads the checkpoint before that call",
        "forks-checkpoint", "G1", "a fork's Space restored from its parent's checkpoint"),
    # ---------------------------------------------------------------- the fenced log
    Mutant(
        "commit-skips-the-fence", "durable/storage/sqlite.py",
        (("                self._admit_epoch(conn)\n", "                pass\n"),),
        "a commit no longer reads the floor in its transaction, so a stale driver's "
        "commits land after a newer driver took the log over",
        "stale", "G4", "stale: the older driver parked at call.returned"),
    Mutant(
        "jsonl-commit-skips-the-fence", "durable/storage/jsonl.py",
        (("            if self._fence is not None:\n                self._fence.check()\n",
          "            pass\n"),),
        "a JSONL commit no longer checks the epoch markers under its lock, so a stale "
        "driver's commits land after a newer driver took the log over",
        "stale-jsonl", "G4", "stale on the JSONL log: the older driver parked at call.returned"),
    Mutant(
        "floor-read-before-the-commit", "durable/storage/sqlite.py",
        (("            if self.epoch_guard is not None:\n"
          "                self._admit_epoch(conn)\n", "            pass\n"),
         ("        failpoint(\"log.commit\")\n",
          "        if self.epoch_guard is not None:\n"
          "            self.epoch_guard.admit(self.read_floor())\n"
          "        failpoint(\"log.commit\")\n")),
        "a commit reads the floor when it begins, outside its transaction, so a stale "
        "driver held between that read and its write lands its commit after a newer "
        "driver took the log over",
        "stale", "G4", "stale: the older driver parked inside its commit (log.commit)"),
    Mutant(
        "jsonl-fence-before-the-lock", "durable/storage/jsonl.py",
        (("        failpoint(\"log.commit\")\n        with self.commit_lock():\n"
          "            if self._fence is not None:\n                self._fence.check()\n",
          "        if self._fence is not None:\n            self._fence.check()\n"
          "        failpoint(\"log.commit\")\n        with self.commit_lock():\n"),),
        "a JSONL commit checks the epoch markers before it takes the commit lock, so a "
        "stale driver held between the check and the append lands its line after a newer "
        "driver took the log over",
        "stale-jsonl", "G4", "stale on the JSONL log: the older driver parked inside its "
        "commit (log.commit)"),
    # ---------------------------------------------------------------- the harness
    Mutant(
        "request-id-ignored", "durable/harness.py",
        (("            known = log.request_entry(self.id, request_id)\n",
          "            known = None\n"),),
        "a resubmitted request is admitted again after every crash",
        "checkpoint", "run", "any run with a second driver"),
    Mutant(
        "never-tool-rerun", "durable/harness.py",
        (("        elif tool.replay == \"safe\":\n",
          "        elif tool.replay in (\"safe\", \"never\"):\n"),),
        "an interrupted never-tool runs again on resume, like a safe one",
        "exhaustive-calls", "G5", "the never-tool killed after it returned"),
    # ---------------------------------------------------------------- the adapter
    Mutant(
        "lost-is-never-started", "durable/adapter/decide.py",
        (("        if facts.ledger == \"unknown\":\n",
          "        if facts.ledger in (\"unknown\", \"lost\"):\n"),),
        "a command the ledger calls lost (it may have run) is run again as if it never "
        "started",
        "exhaustive-daemon", "G2", "restored bash daemon_lost"),
    Mutant(
        "fenced-is-exited", "durable/adapter/decide.py",
        (("        return \"exited\" if info.fenced_by is None else \"fenced\"\n",
          "        return \"exited\"\n"),),
        "a command killed by a newer epoch's fence is replayed as if it had exited",
        "transactional", "G1", "reverted bash fenced (the ci-long command across a kill)"),
    Mutant(
        "generation-not-bumped", "durable/adapter/space_keeper.py",
        (("                s, space=name, generation=s.generation + 1, ready=False))",
          "                s, space=name, generation=s.generation, ready=False))"),),
        "a rebuilt Space keeps the lost one's generation, so a command started in the lost "
        "Space looks as if it never reached the new one and starts again",
        "targeted", "G2", "restored bash space_lost"),
    Mutant(
        "revert-skipped", "durable/adapter/recovery.py",
        ((("        self.image.reimage(call.ctx.log, call.ctx.conversation, call.handle.client)\n"
           "        return self._run(call, decision)\n"),
          "        return self._run(call, decision)\n"),),
        "transactional recovery reruns an unknown call without reverting the workspace",
        "exhaustive-transactional", "G1", "reverted bash daemon_lost (the append's shim died)"),
    Mutant(
        "file-cut-rerun", "durable/adapter/decide.py",
        (("    return _unknown(facts, \"file_cut\" if facts.same_generation else "
          "\"space_lost\")\n",
          "    if facts.tool == \"file\" and facts.same_generation:\n"
          "        return Decision(\"run\", \"no_start_mark\")\n"
          "    return _unknown(facts, \"file_cut\" if facts.same_generation else "
          "\"space_lost\")\n"),),
        "a file call cut before its outcome was recorded is simply run again (a file tool "
        "seems idempotent), so an edit whose write had landed is applied to its own result",
        "exhaustive-files", "G5", "reverted file file_cut (a kill at space.file_written)"),
    Mutant(
        "restore-skipped", "durable/adapter/recovery.py",
        (("            self.checkpoints.restore(call.handle.client, call.checkpoint)\n", ""),),
        "checkpoint recovery of an unknown call does not restore the checkpoint",
        "exhaustive-daemon", "G1", "restored bash daemon_lost (the append's shim died)"),
    Mutant(
        "key-without-call", "durable/adapter/runner.py",
        (("        key = exec_key(self.session, conv, ctx.call_id, n, self.epoch)",
          "        key = exec_key(self.session, conv, \"\", n, self.epoch)"),),
        "the idempotency key leaves out the call, so a driver's second command gets the "
        "first one's recorded result",
        "transactional", "G1", "every run with two commands in one driver"),
    Mutant(
        "adopt-without-checkpoint", "durable/adapter/recovery.py",
        ((("        if decision.take_checkpoint:\n"
           "            self.checkpoints.after_call(call.ctx, call.handle.client)\n"), ""),),
        "an adopted outcome whose checkpoint a crash prevented is never checkpointed, so "
        "a later restore loses the call's effect",
        "targeted", "G1", "adopted bash outcome_recorded, then a restore"),
    # ---------------------------------------------------------------- fences and identity
    Mutant(
        "spaces-shared-across-sessions", "durable/adapter/space_names.py",
        (("    return f\"{prefix}-{token}-c{conversation}\"",
          "    return f\"{prefix}-c{conversation}\""),
         ("    return f\"{token}:{conversation}:{call_id}:{n}@{epoch}\"",
          "    return f\"{conversation}:{call_id}:{n}@{epoch}\"")),
        "Spaces and exec keys are named from the conversation alone, so two sessions on one "
        "provider share a Space and can be answered with each other's results",
        "stale-foreign", "G1", "another session beside the run's"),
    Mutant(
        "equal-epoch-shared", "spacesd/epoch_fence.py",
        (("                raise EpochTaken(epoch, before.epoch)\n", "                pass\n"),),
        "an advance to the floor's own epoch by another owner is admitted, so a new log on a "
        "Space an earlier log raised to the same epoch fences nothing and meets its keys",
        "stale-foreign", "G4", "a new log of the session at the earlier log's epoch"),
    Mutant(
        "fence-kills-groups-only", "spacesd/exec_ledger.py",
        (("        stuck = self._containment.kill(self._trees(groups.values()))\n",
          "        stuck: set[str] = set()\n"),
         # else what it left is the daemon's stray (it adopts orphans), killed all the same
         ("            self._containment.kill_strays(self._trees(self._records.values()),\n"
          "                                          spare=self._helpers())\n", "")),
        "the epoch fence kills an older command's process group but not what it left in a "
        "session of its own, which writes into the workspace after the fence",
        "stale-detached", "G1", "a setsid writer of a command the newer driver fenced"),
    # ---------------------------------------------------------------- the coordinator
    Mutant(
        "coordinator-skips-the-space-check", "durable/coordinator/coordinator.py",
        (("        if self.spaces.exists(space):\n            if rec.placed:",
          "        if True:\n            if rec.placed:"),),
        "the coordinator launches each drive without asking whether the session's Space "
        "still exists, so a Space removed under a host that is up is found by a driver",
        "redrive", "G6", "a Space lost after a kill, or under a live driver"),
    Mutant(
        "vanished-space-is-a-tool-error", "durable/adapter/facade.py",
        ((("                    raise HaltError(f\"the Space {self.space.name(ctx.conversation)} "
           "is gone \"\n"),
          "                    return ToolResult(\"Error: the Space is gone\", is_error=True)\n"
          "                    raise HaltError(f\"the Space {self.space.name(ctx.conversation)} "
          "is gone \"\n"),),
        "a call that finds its Space vanished is recorded as the tool's error, so the session "
        "goes on (and ends done) with that step undone",
        "redrive", "G1", "a Space removed under a live driver"),
    Mutant(
        "claims-never-lapse", "durable/coordinator/store.py",
        (("        claimed_live = rec.state == \"running\" and rec.owner is not None and \\\n"
          "            (rec.claim_until or 0) > now\n",
          "        claimed_live = rec.state == \"running\" and rec.owner is not None\n"),),
        "a running session stays its coordinator's until that coordinator releases it, even "
        "once the claim lapsed, so a coordinator frozen with its host (or cut off from the "
        "store) holds its sessions for good and no other takes them over",
        "redrive", "G6", "frozen_host: a driver frozen with its coordinator"),
    Mutant(
        "new-session-at-the-spaces-epoch", "durable/coordinator/coordinator.py",
        (("        chosen = floor + 1 if floor is not None and floor >= epoch else epoch",
          "        chosen = floor if floor is not None and floor >= epoch else epoch"),),
        "a session's drive whose epoch the Space's floor already reached runs at that very "
        "epoch, the one the Space's earlier session ran at, instead of above it",
        "redrive", "G6", "the race's second session"),
    # ---------------------------------------------------------------- the workspace state
    Mutant(
        "image-drops-empty-directories", "durable/adapter/image.py",
        (("        for e in scan.entries:\n            hit = made.get(e.path)",
          "        for e in scan.entries:\n            if e.kind == \"dir\":\n"
          "                continue\n            hit = made.get(e.path)"),),
        "the transactional image keeps no directories, so a revert or a rebuild deletes the "
        "empty ones committed calls made (git's refs/heads) and loses their modes",
        "shapes-transactional", "G1", "reverted file file_cut after an empty_dir step"),
    Mutant(
        "restore-splits-hardlinks", "spacesd/manifest.py",
        (("            value = FileRec(e.path, e.sha256 or \"\", e.size, e.mode, e.link, "
          "e.extents)",
          "            value = FileRec(e.path, e.sha256 or \"\", e.size, e.mode, None, "
          "e.extents)"),),
        "a checkpoint forgets hardlink groups, so a restore writes each name as a file of its "
        "own (a clone's objects, cp -al) and a later write through one no longer shows in "
        "the other",
        "shapes-checkpoint", "G1", "restored file file_cut after a hardlink step"),
    Mutant(
        "rebuild-refuses-absolute-links", "spacesd/checkpoints.py",
        (("            m = Manifest.from_json(raw_manifest, checkpoint_id)\n",
          "            m = Manifest.from_json(raw_manifest, checkpoint_id)\n"
          "            if any(t.startswith(\"/\") for t in m.symlinks.values()):\n"
          "                raise BadRequest(\"absolute symlink\")\n"),),
        "an import refuses a checkpoint with an absolute link (a venv's bin/python3), so a "
        "lost Space is never rebuilt and every relaunched driver fails",
        "shapes-transactional", "run", "reimaged space space_lost after an abs_symlink step"),
    Mutant(
        "manifest-skips-a-name", "spacesd/checkpoints.py",
        (("            have = self._have\n            for e in entries:\n",
          "            have = self._have\n            for e in entries:\n"
          "                if \"\\n\" in e.path:\n                    continue\n"),),
        "a checkpoint leaves out a name with a newline (what used to wedge restores), so a "
        "restore removes that file",
        "shapes-checkpoint", "G1", "restored file file_cut after an odd_name step"),
    Mutant(
        "write-ignores-a-short-write", "spacesd/fsio.py",
        (("                            f.writelines(chunks)\n"
          "                            f.flush()\n",
          "                            for chunk in chunks:\n"
          "                                with contextlib.suppress(OSError):\n"
          "                                    os.write(fd, chunk)\n"),),
        "the write tool writes its content with os.write and ignores a short count and "
        "ENOSPC, so a write that met a full disk reports success over a cut-short file",
        "work-disk", "G1", "fill_work_disk at a file call's write"),
    Mutant(
        "output-loss-untold", "spacesd/shim.py",
        (("            self.lost_from = self.size\n", ""),),
        "a command's output that a full state disk had no room for is dropped without the "
        "line saying so, so a result cut short passes for the command's whole output (only "
        "a full state disk shows it)",
        "state-disk", "G5", "fill_state_disk while a command prints, freed before it exits"),
    Mutant(
        "jsonl-append-ignores-a-short-write", "durable/storage/jsonl.py",
        (("        if written != len(line):\n"
          "            raise self._uncertain(f\"only {written} of {len(line)} bytes were "
          "written\")\n", ""),),
        "a JSONL commit that a full disk cut short is taken as landed, so the driver goes on "
        "from a result its log holds half of (only a full log disk shows it)",
        "log-disk", "run", "fill_log_disk inside a commit"),
    Mutant(
        "log-commits-not-synced", "durable/storage/sqlite.py",
        (('            conn.execute("PRAGMA synchronous=FULL")\n',
          '            conn.execute("PRAGMA synchronous=NORMAL")\n'),),
        "the SQLite log no longer syncs its WAL at each commit (WAL with synchronous=NORMAL), "
        "so a commit that returned is lost when the host loses power (a SIGKILL keeps it in "
        "the page cache: only a power cut shows it)",
        "host-power", "G7", "cut_host_power after a commit"),
    Mutant(
        "jsonl-append-not-synced", "durable/storage/jsonl.py",
        (("            if written == len(line) and self.fsync:\n",
          "            if written == len(line) and self.fsync and False:\n"),),
        "a JSONL commit returns before its line is synced, so it is lost when the host "
        "loses power (only a power cut shows it)",
        "host-power-jsonl", "G7", "cut_host_power after a commit"),
    Mutant(
        "orphan-gone-not-recorded", "durable/coordinator/coordinator.py",
        (("            if ended is not None:\n", "            if ended:\n"),),
        "a coordinator that takes a session over records the end of the dead coordinator's "
        "drive only when it had to kill its driver, not when it found it gone (its host lost "
        "power), so nothing shows that drive ended before the next was launched",
        "redrive-host-power", "G6", "cut_host_power in redrive"),
)
BY_ID = {m.id: m for m in MUTANTS}


def _copy_project(dest: Path) -> None:
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, dest / pkg,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


def _apply(mutant: Mutant, tree: Path) -> None:
    path = tree / mutant.path
    text = path.read_text()
    for old, new in mutant.edits:
        found = text.count(old)
        if found != 1:
            pytest.fail(f"mutant {mutant.id}: its text occurs {found} times in {mutant.path} "
                        f"(want 1); the code moved: update the mutant\n{old}")
        text = text.replace(old, new)
    path.write_text(text)


@pytest.mark.mutants
@pytest.mark.parametrize("mutant_id", [m.id for m in MUTANTS])
def test_mutant_is_caught(mutant_id: str, tmp_path: Path) -> None:
    mutant = BY_ID[mutant_id]
    from chaos.campaign.ci_subset import BY_NAME

    needs = BY_NAME[mutant.slice].needs
    if needs is not None:
        from chaos.errors import BackendUnavailable
        from chaos.space_providers import make_spaces

        try:
            make_spaces(needs, tmp_path / "probe")
        except BackendUnavailable as exc:
            pytest.skip(f"mutant {mutant.id}'s slice needs the {needs} backend: {exc}")
    tree = tmp_path / "tree"
    _copy_project(tree)
    _apply(mutant, tree)
    env = {**os.environ, "PYTHONPATH": str(tree)}
    env.pop("CUA_FAILPOINTS", None)
    proc = subprocess.run(
        [sys.executable, "-m", "chaos", "ci", "--slice", mutant.slice, "--results",
         str(tmp_path / "results"), "--stop-on-failure", "--jobs", "2"],
        cwd=tree, env=env, capture_output=True, text=True, timeout=SLICE_TIMEOUT_S)
    out = proc.stdout + proc.stderr
    failed = [line for line in proc.stdout.splitlines() if line.startswith("FAILED run=")]
    repro = [line.strip() for line in proc.stdout.splitlines() if "reproduce:" in line]
    if proc.returncode != 1 or not failed:
        summary = [line for line in out.splitlines() if line.startswith("SUMMARY")]
        pytest.fail(f"mutant {mutant.id} SURVIVED the {mutant.slice} slice (exit "
                    f"{proc.returncode}): {mutant.breaks}. {mutant.check} should have caught "
                    f"it at {mutant.where}.\n" + "\n".join(summary or out.splitlines()[-20:]))
    checks = re.search(r"check=(\S+):", failed[0])
    print(f"mutant {mutant.id}: caught by the {mutant.slice} slice, "
          f"check={checks[1] if checks else '?'}\n  {failed[0]}\n  {repro[0] if repro else ''}")


def test_every_mutant_applies_to_the_code_as_it_is(tmp_path: Path) -> None:
    """Cheap and always run: a mutant whose text moved is found at once, not at the gate;
    and one whose patch no longer parses (its text now matches inside a line indented
    deeper) would be caught by any slice for the wrong reason."""
    for mutant in MUTANTS:
        path = ROOT / mutant.path
        text = path.read_text()
        for old, new in mutant.edits:
            assert text.count(old) == 1, f"mutant {mutant.id} no longer applies to {mutant.path}"
            text = text.replace(old, new)
        try:
            compile(text, mutant.path, "exec")
        except SyntaxError as exc:
            raise AssertionError(f"mutant {mutant.id} makes {mutant.path} unparsable ({exc}): "
                                 "update its text to the code as it is") from None
    assert len(MUTANTS) >= 15
    n = len(MUTANTS)
    assert f"**{n}/{n} caught**" in (ROOT / "docs" / "campaigns.md").read_text(), \
        "the mutation score in docs/campaigns.md names every mutant of the gate"
    from chaos.campaign.ci_subset import BY_NAME

    assert {m.slice for m in MUTANTS} <= set(BY_NAME)
