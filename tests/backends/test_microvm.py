"""microVM Spaces on real QEMU guests (marker ``microvm``): lifecycle, finding a Space by
name from another process, the exec ledger and the epoch fence inside the guest, whole-
machine checkpoints (a process counts on from the checkpoint with the same pid, a file
written after it is gone), forks, power loss against a clean restart, and the daemon's
kill. Skipped with the reason when QEMU is missing or the guest cannot be built here."""

from __future__ import annotations

import itertools
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from durable.errors import SpaceError, SpaceFull, SpaceNotFound, SpaceUnavailable, StaleEpochError
from tests.backends.loss_contract import check_a_loss_is_one_instant
from tests.backends.pause_contract import (
    check_a_command_pause_freezes_the_commands_alone,
    check_a_daemon_pause_freezes_the_daemon_alone,
    check_a_pause_freezes_the_space,
)
from tests.escapes import check_the_fence_kills_every_escape

pytestmark = pytest.mark.microvm


@pytest.fixture(scope="module")
def vm_module() -> object:
    import shutil

    if shutil.which("qemu-system-x86_64") is None or shutil.which("qemu-img") is None:
        pytest.skip("QEMU is not installed: apt-get install qemu-system-x86 qemu-utils")
    from backends.microvm import ArtifactsUnavailable, ensure

    try:
        ensure()
    except ArtifactsUnavailable as exc:
        pytest.skip(f"the microVM guest cannot be had here: {exc}")
    import backends.microvm as module

    return module


@pytest.fixture
def vms(vm_module: object, tmp_path: Path) -> Iterator[object]:
    provider = vm_module.MicroVMSpaces(tmp_path / "vms")  # type: ignore[attr-defined]
    yield provider
    for name in provider.names():
        provider.delete(name)


def sh(client: object, key: str, command: str) -> str:
    client.exec_start(key, command)  # type: ignore[attr-defined]
    info = client.exec_wait(key)  # type: ignore[attr-defined]
    assert info.state == "exited", info
    return str(info.output)


_polls = itertools.count(1)


def poll(client: object, command: str, until: Callable[[str], bool],
         timeout: float = 300.0) -> str:
    """The output of ``command``, run again (each time under a new key) until ``until``
    holds for it: an event in the guest, however slow the machine is; only a hang reaches
    ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        out = sh(client, f"poll{next(_polls)}@1", command)
        if until(out):
            return out
        assert time.monotonic() < deadline, f"{command!r} never gave the awaited output: {out!r}"
        time.sleep(0.1)


def printed(client: object, key: str, text: str, timeout: float = 300.0) -> None:
    """Wait until the running command ``key`` printed ``text``."""
    deadline = time.monotonic() + timeout
    while text not in client.exec_wait(key, timeout=0.5).output:  # type: ignore[attr-defined]
        assert time.monotonic() < deadline, f"{key} never printed {text!r}"


def test_a_space_is_made_found_from_another_process_and_deleted(vms, tmp_path: Path) -> None:
    vms.create("a")
    vms.create("a")  # idempotent: the running machine is kept
    assert vms.exists("a") and vms.names() == ["a"] and vms.running("a")
    client = vms.connect("a", epoch=1)
    assert {"process.exec_ledger", "process.epoch"} <= client.capabilities()
    assert client.capabilities() and len(client.describe()["space_id"]) == 32
    found = subprocess.run(
        [sys.executable, "-c", "import sys; from backends.microvm import MicroVMSpaces; "
         f"c = MicroVMSpaces({str(tmp_path / 'vms')!r}).connect('a', epoch=1); "
         "c.write_file('from-elsewhere.txt', b'hello'); print(c.describe()['space_id'])"],
        capture_output=True, text=True, timeout=120)
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == client.describe()["space_id"]
    assert client.read_file("from-elsewhere.txt") == b"hello"
    pid = int((vms.space_dir("a") / "qemu.pid").read_text())
    vms.delete("a")
    assert not vms.exists("a") and vms.names() == []
    with pytest.raises(SpaceNotFound):
        vms.connect("a", epoch=1)
    assert not Path(f"/proc/{pid}").exists() or \
        "qemu" not in Path(f"/proc/{pid}/cmdline").read_text(errors="replace")


def test_the_ledger_and_the_fence_work_inside_the_guest(vms) -> None:
    vms.create("a")
    c1 = vms.connect("a", epoch=1)
    c1.exec_start("once@1", "echo ran >> runs.txt")
    assert c1.exec_wait("once@1").state == "exited"
    c1.exec_start("once@1", "echo ran >> runs.txt")  # a known key never runs again
    assert c1.read_file("runs.txt") == b"ran\n"
    c1.exec_start("slow@1", "sleep 60; echo late >> runs.txt")
    c2 = c1.with_epoch(2)
    killed = c2.advance_epoch(2)["killed"]
    assert "slow@1" in killed
    with pytest.raises(StaleEpochError):
        c1.write_file("stale.txt", b"x")
    assert c2.exec_status("slow@1").state == "exited"


def test_a_machine_checkpoint_brings_processes_back_and_writes_after_it_are_gone(
        vm_module, vms) -> None:
    vms.create("a")
    snaps = vm_module.SandboxSnapshots(vms)
    c = vms.connect("a", epoch=1)
    # /tmp/n is replaced whole (a rename): a SIGSTOP between the shell's truncation of the
    # file and its write would leave it empty (it did, once, in CI)
    c.exec_start("counter@1", "echo $$ > /tmp/pid; i=0; while true; do i=$((i + 1)); "
                 "echo $i > /tmp/n.new; mv /tmp/n.new /tmp/n; sleep 0.1; done")
    pid = poll(c, "cat /tmp/pid 2>/dev/null", str.strip).strip()
    poll(c, "cat /tmp/n 2>/dev/null", str.strip)
    # Stopped while checkpointed, so the restored counter shows exactly the checkpoint's
    # count (a running one would count on by however long the restore took).
    sh(c, "stop1@1", f"kill -STOP {pid}")
    at_checkpoint = int(sh(c, "read1@1", "cat /tmp/n"))
    snaps.checkpoint("a", "cp1")
    c.write_file("after.txt", b"written after the checkpoint")
    sh(c, "cont1@1", f"kill -CONT {pid}")
    later = int(poll(c, "cat /tmp/n", lambda out: int(out) > at_checkpoint + 5))
    snaps.restore_space("a", "cp1")
    assert c.stat("after.txt") is None
    assert c.exec_status("counter@1").state == "running"
    again = int(sh(c, "read3@1", "cat /tmp/n"))  # a key the checkpoint never saw: new
    assert sh(c, "pid2@1", "cat /tmp/pid").strip() == pid
    assert again == at_checkpoint < later, (at_checkpoint, again, later)
    sh(c, "cont2@1", f"kill -CONT {pid}")  # the restored process counts on from there
    poll(c, "cat /tmp/n", lambda out: int(out) > at_checkpoint)
    assert snaps.list("a") == ["cp1"]
    snaps.fork("a", "cp1", "b")
    b = vms.connect("b", epoch=1)
    assert b.exec_status("counter@1").state == "running" and b.stat("after.txt") is None
    assert b.describe()["space_id"] == c.describe()["space_id"]  # the same machine, forked
    snaps.delete("a", "cp1")
    assert snaps.list("a") == []
    for i in range(3):  # the adapter's checkpoints: every one is kept
        snaps.take(c, f"t{i}")
    snaps.take(c, "t0")  # taken again: replaced whole, and now the newest
    assert snaps.list("a") == ["t1", "t2", "t0"]
    assert len([p for p in snaps.store.iterdir() if p.is_dir()]) == 3


def _wait_for(what: str, ready: Callable[[], bool], timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, f"waited {timeout:.0f} s for {what}"
        time.sleep(0.02)


def test_a_checkpoint_whose_caller_is_killed_ends_whole(vm_module, vms,
                                                         tmp_path: Path) -> None:
    """A machine checkpoint is a job of its own: its caller SIGKILLed in the middle (as a
    campaign kills drivers) leaves the machine running, not stopped between the end of its
    state's stream and the ``cont`` after the copy; the state it saved has no record, and
    the next take of that id clears it away."""
    import psutil

    vms.create("a")
    store = tmp_path / "machines"
    code = ("import sys; from backends.microvm import MicroVMSpaces, SandboxSnapshots; "
            "SandboxSnapshots(MicroVMSpaces(sys.argv[1]), sys.argv[2]).checkpoint('a', 'k1')")
    caller = subprocess.Popen([sys.executable, "-c", code, str(vms.base_dir), str(store)])
    try:
        _wait_for("the save job to begin", lambda: any(store.glob("k1.*")))
    finally:
        caller.kill()
        caller.wait()

    def job_running() -> bool:
        for proc in psutil.process_iter(["cmdline"]):
            if str(store) in " ".join(proc.info["cmdline"] or []):
                return True
        return False

    _wait_for("the save job to end by itself", lambda: not job_running())
    assert vms.qmp("a").status() == "running"
    snaps = vm_module.SandboxSnapshots(vms, store)
    assert snaps.list("a") == []  # no record: the caller died before it
    c = vms.connect("a", epoch=1)
    c.write_file("alive.txt", b"the machine runs")
    snaps.take(c, "k1")
    assert snaps.list("a") == ["k1"]
    assert len([p for p in store.iterdir() if p.is_dir()]) == 1


def test_a_lost_space_and_a_fork_start_from_machine_checkpoints(vm_module, vms,
                                                                 tmp_path: Path) -> None:
    """Machine checkpoints live outside the Space: a Space lost in checkpoint mode is
    started again from its newest one (its memory too: a file only in tmpfs is back), and a
    conversation forked at an entry starts from its parent's checkpoint of that entry."""
    from tests.durable.adapter.test_adapter import SPACE, open_session, results, run, steps

    snaps = vm_module.SandboxSnapshots(vms, tmp_path / "machines")
    plan = steps(("bash", {"command": "echo one > a.txt; echo in-memory > /dev/shm/m"}),
                 ("bash", {"command": "echo two >> a.txt"}),
                 ("bash", {"command": "cat a.txt /dev/shm/m"}),
                 ("bash", {"command": "true"}))
    s = open_session(tmp_path, vms, plan[:2], epoch=1, mode="checkpoint", snapshots=snaps)
    run(s)
    s.harness.close()
    vms.delete(SPACE)
    s = open_session(tmp_path, vms, plan[:3], epoch=2, mode="checkpoint", snapshots=snaps)
    run(s, "r2")  # the next call finds the Space gone and starts it from its checkpoint
    assert [e.kind for e in s.adapter.events][:1] == ["restored"], s.adapter.events
    assert all(not r["is_error"] for r in results(s)), results(s)
    assert results(s)[-1]["content"] == "one\ntwo\nin-memory\n", results(s)[-1]
    s.harness.close()
    s = open_session(tmp_path, vms, plan, epoch=3, mode="checkpoint", snapshots=snaps)
    run(s, "r3")
    assert len(results(s)) == 4, results(s)
    assert "restored" not in [e.kind for e in s.adapter.events], \
        "the Space started from its checkpoint was taken for another one by the next driver"
    first = next(e for e in s.harness.log.entries(1) if e.kind == "tool_result")
    child = s.harness.root("a").fork(first.id)
    client = s.adapter.ensure_space(s.harness, child.id)
    assert client.name != SPACE
    assert client.read_file("a.txt") == b"one\n", "the second call came after the fork entry"
    assert sh(client, "shm@2", "cat /dev/shm/m") == "in-memory\n"
    s.harness.close()


def test_a_power_loss_loses_unsynced_writes_and_a_clean_restart_keeps_them(vms) -> None:
    vms.create("a")
    c = vms.connect("a", epoch=1)
    sh(c, "w1@1", "echo kept-by-a-clean-reboot > clean.txt")
    vms.restart("a")  # a clean reboot syncs first
    assert c.read_file("clean.txt") == b"kept-by-a-clean-reboot\n"
    c.exec_start("w2@1", "echo synced > synced.txt; sync synced.txt; echo durable; sleep 60")
    printed(c, "w2@1", "durable")
    c.write_file("daemon.txt", b"fsynced by the daemon")
    # The unsynced write comes after the last fsync, with the guest's periodic writeback
    # off: nothing promises an unsynced write is lost, and under load the kernel wrote it
    # back before the cut (once in CI), as it does 30 s after a write.
    c.exec_start("w3@1", "echo 0 > /proc/sys/vm/dirty_writeback_centisecs; "
                 "echo unsynced > unsynced.txt; echo written; sleep 60")
    printed(c, "w3@1", "written")
    vms.power_loss("a")
    assert not (c.stat("unsynced.txt") and c.read_file("unsynced.txt"))  # content lost
    assert c.read_file("synced.txt") == b"synced\n"
    assert c.read_file("daemon.txt") == b"fsynced by the daemon"
    # the ledger's record was fsynced before the spawn: the key is known, its end lost
    assert c.exec_status("w2@1").state == "lost"
    assert c.exec_status("w3@1").state == "lost"
    assert c.exec_status("w1@1").state == "exited"


def test_every_entry_the_daemon_changed_survives_a_power_loss(vms) -> None:
    """What spacesd acknowledged is on the disk: links, directories made (also as a new
    file's parents) and removals. A power cut right after each would lose an entry whose
    directory was not synced (found by the power-loss campaign: a seeded symlink lost)."""
    vms.create("a")
    c = vms.connect("a", epoch=1)
    c.write_file("gone.txt", b"to be removed")
    c.symlink("links/readme", "../gone.txt")
    c.mkdir("made/inner")
    c.write_file("new/deep/file.txt", b"in new directories")
    c.remove("gone.txt")
    vms.power_loss("a")
    assert c.stat("links/readme")["kind"] == "symlink"
    assert c.stat("made/inner")["kind"] == "dir"
    assert c.read_file("new/deep/file.txt") == b"in new directories"
    assert c.stat("gone.txt") is None


def test_a_full_disk_stays_full_through_a_power_cut_until_it_is_freed(vms) -> None:
    """``fill_disk`` takes the machine's one disk (the guest agent's ``fill-disk``): a write
    and a command's start (its ledger record) meet ENOSPC, the daemon still serves, and it
    comes back from a power cut with the disk still full; ``free_disk`` on a machine that
    is off says so (the nemesis tries again), and once it runs gives the room back."""
    vms.create("full")
    c = vms.connect("full", epoch=1)
    c.write_file("kept.txt", b"written before the disk filled")
    vms.fill_disk("full", "work", leave=4096)
    # the workspace's own ENOSPC is the write's error; the daemon's, for its ledger, SpaceFull
    with pytest.raises(SpaceError, match=r"'big\.bin': No space left on device"):
        c.write_file("big.bin", b"x" * 256 * 1024)
    with pytest.raises(SpaceFull):
        c.exec_start("dd@1", "dd if=/dev/zero of=more.bin bs=64k count=8")
    vms.power_off("full")
    with pytest.raises(SpaceUnavailable, match="is off"):
        vms.free_disk("full", "work")
    vms.create("full")  # boots it again: its daemon serves on a full disk
    assert c.read_file("kept.txt") == b"written before the disk filled"
    with pytest.raises(SpaceError, match="No space left on device"):
        c.write_file("big.bin", b"x" * 256 * 1024)
    vms.free_disk("full", "work")
    c.write_file("big.bin", b"x" * 256 * 1024)
    assert sh(c, "dd@2", "dd if=/dev/zero of=more.bin bs=64k count=8 2>/dev/null; "
              "stat -c %s more.bin") == f"{512 * 1024}\n"
    names = [e["name"] for e in c.list_dir("")]
    assert "cua-disk-filler" not in names and "big.bin" in names  # never in the workspace


def test_a_killed_daemon_comes_back_and_its_command_runs_on(vms) -> None:
    vms.create("a")
    c = vms.connect("a", epoch=1)
    c.exec_start("run@1", "sleep 3; echo done")
    vms.kill_daemon("a")
    info = c.exec_wait("run@1")
    assert (info.state, info.exit_code, info.output) == ("exited", 0, "done\n")
    state = vms.space_dir("a").parent / "state-copy"
    vms.save_state("a", state)
    assert (state / "ledger.jsonl").read_text().count('"run@1"') >= 1


def test_a_loss_saves_the_state_of_its_instant(vms, tmp_path: Path) -> None:
    check_a_loss_is_one_instant(vms, "s", tmp_path / "lost")


def test_no_escape_survives_the_fence(vms) -> None:
    """setsid, a double fork, ``env -i`` and a root command's move to the root cgroup all
    die with their epoch inside the guest."""
    vms.create("s")
    check_the_fence_kills_every_escape(vms.connect("s", epoch=1))


def test_a_clock_jump_steps_the_guests_clock_and_set_clock_sets_it_right(vms) -> None:
    """The nemesis's ``jump_clock``: the guest's clock an hour back (then a day ahead) of
    the host's while the Space goes on serving, and the host's again after."""
    vms.create("clock")
    c = vms.connect("clock", epoch=1)

    def offset(key: str) -> float:
        """The guest's clock minus the host's (to within half the read's time)."""
        before = time.time()
        guest = float(sh(c, key, "date +%s.%N"))
        return guest - (before + time.time()) / 2

    slack = 30.0  # a busy host's: neither the read nor the request that sets it is instant
    assert abs(offset("t0@1")) < slack
    vms.set_clock("clock", offset=-3600.0)
    assert abs(offset("t1@1") + 3600.0) < slack
    vms.set_clock("clock", offset=86400.0)
    assert abs(offset("t2@1") - 86400.0) < slack
    c.write_file("after-jump.txt", b"the Space serves on")
    vms.set_clock("clock")
    assert abs(offset("t3@1")) < slack
    assert c.read_file("after-jump.txt") == b"the Space serves on"

    # A jump's end after its machine lost power, or after its Space was removed (the fault
    # matrix ended one on a deleted Space, and the run came out unknown): off, the machine
    # keeps no time (its boot sets the host's), so the end is done and a new jump refused;
    # gone, the Space is not found, which a fault's end takes as nothing to undo.
    vms.power_off("clock")
    assert not vms.running("clock")
    vms.set_clock("clock")
    with pytest.raises(SpaceUnavailable, match="is off"):
        vms.set_clock("clock", offset=60.0)
    vms.delete("clock")
    with pytest.raises(SpaceNotFound):
        vms.set_clock("clock")


def test_a_daemon_pause_freezes_the_daemon_and_its_commands_run_on(vms) -> None:
    check_a_daemon_pause_freezes_the_daemon_alone(vms, "vmd")


def test_a_command_pause_freezes_the_commands_and_the_daemon_answers(vms) -> None:
    check_a_command_pause_freezes_the_commands_alone(vms, "vmc")


def test_a_pause_stops_the_machine_and_a_resume_goes_on(vms) -> None:
    check_a_pause_freezes_the_space(vms, "vm", late_requests_land=False)


def test_a_loaded_machine_that_never_serves_is_loaded_again_then_named(
        vm_module, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A state saved with its daemon frozen loads into a machine that runs but never
    serves: the load is done a second time (said on stderr), then fails with what failed
    last, never hanging and never reporting success."""
    from backends.microvm import provider

    monkeypatch.setattr(provider, "LOAD_SERVE_S", 4.0)
    monkeypatch.setattr(provider, "BOOT_TIMEOUT_S", 6.0)
    vms = vm_module.MicroVMSpaces(tmp_path / "vms", request_timeout=1.0)  # type: ignore[attr-defined]
    try:
        vms.create("frozen")
        vms.pause_daemon("frozen")
        vms.save_machine("frozen", tmp_path / "state")
        with pytest.raises(provider.NotServing) as failed:
            vms.load_machine("frozen", tmp_path / "state")
        assert "did not serve within 6 s (last: its daemon's health:" in str(failed.value)
        assert "did not serve within 4 s" in capsys.readouterr().err
        assert vms.running("frozen")  # the second machine, left for its owner to delete
    finally:
        for name in vms.names():
            vms.delete(name)
