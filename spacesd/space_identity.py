"""Which Space this is: an id made once, when the daemon first starts on an empty state
directory, and kept with that state for the Space's whole life.

A daemon restart or a machine restart keeps the id (the state disk survives them); a Space
deleted and created again under the same name gets a new one. The host side records the id
of the Space that holds its log's state, so a Space replaced under its name (by an operator,
a coordinator placing a new one, a provider that reuses names) is told from the one the log
describes and rebuilt, never trusted as it is.
"""

from __future__ import annotations

import os
import re
import uuid

from .fsio import AtomicWriter

#: What an id is: 32 lower-case hex digits (a random UUID).
_ID = re.compile(r"[0-9a-f]{32}")


class DamagedIdentity(Exception):
    """The id file exists and does not hold an id: making a new one would let a host take
    this Space for another, so the daemon stops instead."""


def load_space_id(path: str, writer: AtomicWriter) -> str:
    """The id stored at ``path``, made (atomically, fsynced) when there is none yet."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        space_id = uuid.uuid4().hex
        writer.write(path, [space_id.encode() + b"\n"], mode=0o644)
        return space_id
    text = raw.decode("ascii", "replace").strip()
    if not _ID.fullmatch(text):
        raise DamagedIdentity(
            f"{path} does not hold a Space id ({len(raw)} bytes: {raw[:40]!r}); it is written "
            "atomically, so the disk damaged it. Remove the Space (its hosts rebuild it from "
            f"their logs), or remove {os.path.basename(path)} to make this a new Space")
    return text
