"""The rules for paths the protocol accepts, shared by file ops, scans and checkpoints.

A protocol path is relative to the workspace root, '/'-separated, never absolute, never
climbing with ``..``, and free of NUL, newline, carriage return and backslash: such names
cannot travel through line-based tools and the workspace hash unambiguously, so file ops
refuse to make them and scans report them as refused.
"""

from __future__ import annotations

import os
import posixpath
import re
import stat

from .errors import OutsideRoot

_BAD_CHARS = {"\x00": "a NUL byte", "\n": "a newline", "\r": "a carriage return",
              "\\": "a backslash"}
_BAD = re.compile("[" + re.escape("".join(_BAD_CHARS)) + "]")


def bad_char(name: str) -> str | None:
    """What makes ``name`` unrepresentable, or None (scans call this for every entry)."""
    found = _BAD.search(name)
    return _BAD_CHARS[found.group()] if found else None


def split_rel(path: str) -> list[str]:
    """The components of a protocol path (``""`` and ``"."`` are the root itself)."""
    if path.startswith("/"):
        raise OutsideRoot(f"path {path!r} is absolute; give a path relative to the "
                          "workspace root")
    what = bad_char(path)
    if what:
        raise OutsideRoot(f"path {path!r} contains {what}; such names are not allowed")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise OutsideRoot(f"path {path!r} climbs with '..'; give a path inside the "
                          "workspace without '..'")
    return parts


def check_link_target(rel_parts: list[str], target: str) -> None:
    """Refuse a symlink target that leads outside the root from the link at ``rel_parts``."""
    what = bad_char(target)
    if not target or what:
        raise OutsideRoot(f"symlink target {target!r} is empty or contains {what}")
    if target.startswith("/"):
        raise OutsideRoot(f"symlink target {target!r} is absolute; use a target relative "
                          "to the link, inside the workspace")
    joined = posixpath.normpath(posixpath.join("/".join(rel_parts[:-1]), target))
    if joined == ".." or joined.startswith("../"):
        raise OutsideRoot(f"symlink target {target!r} leads outside the workspace")


def inside(real: str, root: str) -> bool:
    """Whether the resolved path ``real`` is ``root`` or under it."""
    return real == root or real.startswith(root.rstrip("/") + "/")


def kind_of(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "other"


def is_exec(mode: int) -> bool:
    """The exec bit that counts in the workspace hash: the owner's."""
    return bool(mode & stat.S_IXUSR)


def describe(path: str, full: str, st: os.stat_result) -> dict:
    """The protocol's description of one entry (``stat``, ``list_dir``)."""
    kind = kind_of(st.st_mode)
    return {
        "path": path,
        "kind": kind,
        "size": st.st_size if kind == "file" else 0,
        "mode": stat.S_IMODE(st.st_mode),
        "exec": kind == "file" and is_exec(st.st_mode),
        "mtime_ns": st.st_mtime_ns,
        "target": os.readlink(full) if kind == "symlink" else None,
    }
