"""File operations, and that none of them escapes the workspace root."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from backends.local import LocalSpace
from backends.space_client import HttpSpaceClient
from durable.errors import SpaceError


def refused(code: str, fn, *args, **kwargs) -> SpaceError:
    with pytest.raises(SpaceError) as exc:
        fn(*args, **kwargs)
    assert exc.value.code == code, exc.value
    return exc.value


def test_read_write_edit_stat_list_remove(client: HttpSpaceClient, space: LocalSpace) -> None:
    client.write_file("src/a.py", b"print('hello')\n")
    assert (space.work / "src/a.py").read_bytes() == b"print('hello')\n"
    assert client.read_file("src/a.py", offset=7, limit=5) == b"hello"
    client.edit_file("src/a.py", "hello", "world")
    assert client.read_file("src/a.py") == b"print('world')\n"
    client.write_file("run.sh", b"#!/bin/sh\n", mode=0o755)
    st = client.stat("run.sh")
    assert (st["kind"], st["exec"], st["mode"], st["size"]) == ("file", True, 0o755, 10)
    client.write_file("run.sh", b"#!/bin/sh\necho\n")  # the mode is kept on overwrite
    assert client.stat("run.sh")["mode"] == 0o755
    assert client.stat("missing") is None
    assert [e["name"] for e in client.list_dir("")] == ["run.sh", "src"]
    assert client.list_dir("src")[0]["kind"] == "file"
    client.mkdir("d/e/f")
    assert client.stat("d/e/f")["kind"] == "dir"
    refused("conflict", client.remove, "d")
    client.remove("d", recursive=True)
    client.remove("d")  # already gone: nothing to do
    assert not (space.work / "d").exists()
    refused("not_found", client.read_file, "missing")
    refused("conflict", client.read_file, "src")
    refused("bad_request", client.remove, "")


def test_edit_needs_exactly_one_occurrence(client: HttpSpaceClient) -> None:
    client.write_file("f.txt", b"one two two\n")
    err = refused("conflict", client.edit_file, "f.txt", "three", "3")
    assert "not found" in str(err)
    err = refused("conflict", client.edit_file, "f.txt", "two", "2")
    assert "occurs 2 times" in str(err)
    assert client.read_file("f.txt") == b"one two two\n"


def test_symlinks_are_kept_as_links(client: HttpSpaceClient, space: LocalSpace) -> None:
    client.write_file("target.txt", b"old")
    client.symlink("link", "target.txt")
    assert client.stat("link")["target"] == "target.txt"
    assert client.read_file("link") == b"old"
    client.write_file("link", b"new")  # writes through the link, keeps it
    assert os.readlink(space.work / "link") == "target.txt"
    assert (space.work / "target.txt").read_bytes() == b"new"
    client.symlink("link", "other.txt")  # replaces the link
    assert os.readlink(space.work / "link") == "other.txt"
    client.remove("link")
    assert (space.work / "target.txt").exists()


@pytest.mark.parametrize(("path", "code"), [
    ("../escape.txt", "outside_root"),
    ("a/../../escape.txt", "outside_root"),
    ("/etc/passwd", "outside_root"),
    ("nul\x00byte", "bad_request"),  # no Linux name holds a NUL
    ("\ud800lone", "bad_request"),  # a surrogate that stands for no byte
])
def test_paths_that_leave_the_root_are_refused(client: HttpSpaceClient, space: LocalSpace,
                                               path: str, code: str) -> None:
    refused(code, client.write_file, path, b"x")
    refused(code, client.read_file, path)
    refused(code, client.edit_file, path, "a", "b")
    refused(code, client.stat, path)
    refused(code, client.remove, path)
    refused(code, client.mkdir, path)
    refused(code, client.symlink, path, "x")
    refused(code, client.list_dir, path)
    assert not (space.dir / "escape.txt").exists()


#: Names real programs make: what unzip leaves of a Windows archive, a newline or a CR in a
#: name, a leading dash, bytes that are not UTF-8 (as os.fsdecode carries them), 255 bytes.
ODD_NAMES = ["C:\\temp\\report.txt", "new\nline", "cr\rname", "-rf", "tab\there", " space ",
             os.fsdecode(b"latin1-caf\xe9"), "\u00e9t\u00e9", "n" * 255]


@pytest.mark.parametrize("name", ODD_NAMES)
def test_every_name_linux_allows_is_a_name(client: HttpSpaceClient, space: LocalSpace,
                                           name: str) -> None:
    """Bash makes these; the file ops, the scan and the hash take them as they are."""
    client.write_file(f"d/{name}", b"x")
    assert (space.work / "d" / name).read_bytes() == b"x"
    assert client.read_file(f"d/{name}") == b"x"
    client.edit_file(f"d/{name}", "x", "y")
    assert [e.path for e in client.scan().entries] == ["d", f"d/{name}"]
    assert [e["name"] for e in client.list_dir("d")] == [name]
    client.symlink("d/lnk", name)
    assert client.read_file("d/lnk") == b"y"
    client.remove(f"d/{name}")
    client.remove("d/lnk")
    assert os.listdir(space.work / "d") == []


def test_symlinks_that_lead_out_are_refused(client: HttpSpaceClient, space: LocalSpace) -> None:
    outside = space.dir / "outside.txt"
    outside.write_bytes(b"secret")
    os.symlink(outside, space.work / "out-file")
    os.symlink(space.dir, space.work / "out-dir")
    refused("outside_root", client.read_file, "out-file")
    refused("outside_root", client.write_file, "out-file", b"pwned")
    refused("outside_root", client.edit_file, "out-file", "secret", "pwned")
    refused("outside_root", client.write_file, "out-dir/outside.txt", b"pwned")
    refused("outside_root", client.read_file, "out-dir/outside.txt")
    refused("outside_root", client.list_dir, "out-dir")
    refused("outside_root", client.remove, "out-dir/outside.txt")
    refused("outside_root", client.mkdir, "out-dir/new")
    assert outside.read_bytes() == b"secret"
    assert not (space.dir / "new").exists()
    # The links themselves are workspace entries: they can be inspected and removed.
    assert client.stat("out-file")["kind"] == "symlink"
    client.remove("out-file")
    assert outside.exists()
    # And none can be made to point out.
    refused("outside_root", client.symlink, "l1", "../outside.txt")
    refused("outside_root", client.symlink, "a/l2", "../../outside.txt")
    refused("outside_root", client.symlink, "l3", str(outside))
    client.symlink("a/ok", "../target")  # stays inside: allowed


def test_writes_are_atomic_and_leave_no_temp_files(client: HttpSpaceClient,
                                                   space: LocalSpace) -> None:
    for n in range(20):
        client.write_file("f.bin", bytes([n]) * 100_000)
    assert sorted(p.name for p in Path(space.work).iterdir()) == ["f.bin"]
    assert (space.work / "f.bin").read_bytes() == bytes([19]) * 100_000
