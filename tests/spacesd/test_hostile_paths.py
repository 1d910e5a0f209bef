"""Hostile input in the Space: races between check and use, symlink chains, set-id bits,
private files in the checkpoint store, the token file's mode. Real daemons throughout."""

from __future__ import annotations

import io
import json
import os
import signal
import stat
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from backends.local import LocalSpace, LocalSpaces
from backends.space_client import HttpSpaceClient
from durable.errors import SpaceError

#: Swaps ``<work>/d`` between a real directory and a symlink to ``<sentinel>`` as fast as
#: it can, until killed: one ``renameat2(RENAME_EXCHANGE)`` a turn, so ``d`` is always one
#: or the other (with rename/symlink/unlink steps where the kernel lacks it).
SWAPPER = r"""
import ctypes, os, sys
work, sentinel = sys.argv[1], sys.argv[2]
d, other = os.path.join(work, "d"), os.path.join(work, "d.other")
os.makedirs(d, exist_ok=True)
os.symlink(sentinel, other)
libc = ctypes.CDLL(None, use_errno=True)
exchange = getattr(libc, "renameat2", None)
AT_FDCWD, RENAME_EXCHANGE = -100, 2
a, b = d.encode(), other.encode()
if exchange is not None and exchange(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE) != 0:
    exchange = None
print("ready", flush=True)
while True:
    if exchange is not None:
        exchange(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE)
        continue
    try:
        os.rename(d, d + ".aside")
        os.symlink(sentinel, d)
        os.unlink(d)
        os.rename(d + ".aside", d)
    except OSError:
        pass
"""


def refused(code: str, fn, *args, **kwargs) -> SpaceError:
    with pytest.raises(SpaceError) as exc:
        fn(*args, **kwargs)
    assert exc.value.code == code, exc.value
    return exc.value


def outside_entries(sentinel: Path) -> list[str]:
    return sorted(str(p.relative_to(sentinel)) for p in sentinel.rglob("*"))


@pytest.fixture
def sentinel(space: LocalSpace, tmp_path: Path) -> Path:
    out = tmp_path / "sentinel"
    out.mkdir()
    (out / "secret.txt").write_bytes(b"SECRET")
    return out


def run_swapper(space: LocalSpace, sentinel: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", SWAPPER, str(space.work), str(sentinel)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)  # ours, by its pid
    proc.wait(timeout=120)
    if proc.stdout is not None:
        proc.stdout.close()


def test_a_directory_swapped_for_a_symlink_never_gets_a_byte_outside(
        client: HttpSpaceClient, space: LocalSpace, sentinel: Path) -> None:
    outcomes: dict[str, int] = {}
    deadline = time.monotonic() + 30
    proc = run_swapper(space, sentinel)
    try:
        for n in range(3000):
            path = ("d/f.txt", "d/sub/f.txt", "d/secret.txt")[n % 3]
            try:
                client.write_file(path, b"pwned %d\n" % n)
                outcomes["ok"] = outcomes.get("ok", 0) + 1
            except SpaceError as exc:
                code = str(exc.code)
                outcomes[code] = outcomes.get(code, 0) + 1
            if time.monotonic() > deadline:
                break
        # Reads, mkdirs, links and removals under the same race.
        for n in range(600):
            op = n % 4
            try:
                if op == 0:
                    assert client.read_file("d/secret.txt") != b"SECRET"
                elif op == 1:
                    client.mkdir(f"d/made{n}/x")
                elif op == 2:
                    client.symlink(f"d/link{n}", "f.txt")
                else:
                    client.remove("d/secret.txt")
            except SpaceError:
                pass
    finally:
        stop(proc)
    assert outside_entries(sentinel) == ["secret.txt"], outcomes
    assert (sentinel / "secret.txt").read_bytes() == b"SECRET"
    assert outcomes.get("ok", 0) > 0, outcomes  # the race was run, not refused throughout


def test_symlink_chains_cannot_lead_out(client: HttpSpaceClient, space: LocalSpace) -> None:
    client.mkdir("a")
    client.symlink("a/b", "..")  # a/b is the root itself: inside
    # Textually 'a/b/..' is 'a'; really a/b is the root, so '..' is outside.
    refused("outside_root", client.symlink, "a/b/c", "..")
    refused("outside_root", client.symlink, "a/b/c", "../x")
    refused("outside_root", client.symlink, "a/b/sub/c", "../../x")
    # '..' after a name: that name may be, or become, a link ('a/b/../..' is outside).
    refused("outside_root", client.symlink, "x", "a/b/../..")
    refused("outside_root", client.symlink, "y", "a/../b")
    # Made by a process in the Space, a chain that leads out is not followed.
    os.symlink("../..", space.work / "a" / "up")
    refused("outside_root", client.write_file, "a/up/escape.txt", b"x")
    refused("outside_root", client.read_file, "a/b/a/up/x")
    refused("outside_root", client.mkdir, "a/up/new")
    assert not (space.dir.parent / "escape.txt").exists()
    assert not (space.dir.parent / "new").exists()
    # Links that stay inside work, through a chain too.
    client.write_file("a/b/a/f.txt", b"through the chain")
    assert (space.work / "a/f.txt").read_bytes() == b"through the chain"
    client.symlink("a/b/l", "a/f.txt")  # its real parent is the root
    assert client.read_file("l") == b"through the chain"
    client.symlink("a/deep/l2", "../f.txt")
    assert client.read_file("a/deep/l2") == b"through the chain"
    # A loop is refused, not followed forever.
    client.symlink("loop1", "loop2")
    client.symlink("loop2", "loop1")
    refused("outside_root", client.read_file, "loop1")


def test_imported_links_are_data_and_never_followed(spaces: LocalSpaces,
                                                      client: HttpSpaceClient) -> None:
    """A checkpoint keeps every link as it was (a virtualenv's ``bin/python3 ->
    /usr/bin/python3``, a link that climbs out): restore makes it verbatim and follows none,
    and the daemon's file ops still refuse to follow one out of the workspace."""
    client.mkdir("a")
    client.write_file("a/f.txt", b"x")
    client.symlink("a/ok", "f.txt")
    client.checkpoint_create("cp")
    tar = b"".join(client.checkpoint_export("cp"))
    links = {"a/up": "../..", "abs": "/etc/passwd", "a/mid": "x/../../..", "loop": "loop"}

    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(tar)) as src, tarfile.open(fileobj=out, mode="w") as dst:
        for member in src:
            f = src.extractfile(member)
            assert f is not None
            data = f.read()
            if member.name == "manifest.json":
                raw = json.loads(data)
                raw["symlinks"].update(links)
                data = json.dumps(raw).encode()
            member.size = len(data)
            dst.addfile(member, io.BytesIO(data))

    spaces.create("other")
    other = spaces.connect("other", epoch=1)
    assert other.checkpoint_import("cp", io.BytesIO(out.getvalue())).files == 1
    other.checkpoint_restore("cp")
    for path, target in links.items():
        st = other.stat(path)
        assert st is not None and st["target"] == target
    refused("outside_root", other.read_file, "abs")
    refused("outside_root", other.write_file, "a/up/escape.txt", b"x")
    refused("outside_root", other.read_file, "loop")
    assert other.read_file("a/ok") == b"x"


def test_set_id_bits_a_call_asks_for_are_stripped_and_kept_otherwise(
        client: HttpSpaceClient, space: LocalSpace) -> None:
    client.write_file("suid", b"#!/bin/sh\n", mode=0o6755)
    client.write_file("sticky", b"x", mode=0o1644)
    assert stat.S_IMODE((space.work / "suid").stat().st_mode) == 0o755
    assert stat.S_IMODE((space.work / "sticky").stat().st_mode) == 0o644
    # An overwrite keeps the whole mode a command gave the file, as a shell's '>' does.
    os.chmod(space.work / "suid", 0o4755)
    client.write_file("suid", b"#!/bin/sh\necho\n")
    assert stat.S_IMODE((space.work / "suid").stat().st_mode) == 0o4755
    # A restore brings back what the workspace had, every bit of it.
    os.mkdir(space.work / "shared")
    os.chmod(space.work / "shared", 0o3775)
    client.checkpoint_create("cp")
    (space.work / "suid").unlink()
    os.rmdir(space.work / "shared")
    client.checkpoint_restore("cp")
    assert stat.S_IMODE((space.work / "suid").stat().st_mode) == 0o4755
    assert stat.S_IMODE((space.work / "shared").stat().st_mode) == 0o3775


def test_checkpoint_copies_of_private_files_stay_private(client: HttpSpaceClient,
                                                        space: LocalSpace) -> None:
    client.write_file("private.key", b"-----BEGIN KEY-----\n", mode=0o600)
    client.write_file("public.txt", b"hello\n", mode=0o644)
    client.checkpoint_create("cp")
    store = space.state / "checkpoints"
    objects = [p for p in (store / "objects").rglob("*") if p.is_file()]
    assert len(objects) == 2
    for p in [store, *store.rglob("*")]:
        assert stat.S_IMODE(p.stat().st_mode) & 0o077 == 0, (p, oct(p.stat().st_mode))
    # Restore still gives each file its own mode back.
    (space.work / "private.key").unlink()
    client.checkpoint_restore("cp")
    assert stat.S_IMODE((space.work / "private.key").stat().st_mode) == 0o600
    assert stat.S_IMODE((space.work / "public.txt").stat().st_mode) == 0o644


def test_the_token_file_is_private_from_the_start(spaces: LocalSpaces,
                                                  space: LocalSpace) -> None:
    assert stat.S_IMODE(space.token_file.stat().st_mode) == 0o600
    assert not [p.name for p in space.state.iterdir() if p.name.startswith("token.tmp")]
    old = os.umask(0)  # a permissive umask must not matter
    try:
        spaces.create("s2")
    finally:
        os.umask(old)
    assert stat.S_IMODE(spaces.get("s2").token_file.stat().st_mode) == 0o600
