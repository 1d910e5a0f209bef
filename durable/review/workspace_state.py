"""The workspace of a conversation as of an entry, from what the log keeps of it.

- transactional mode and virtual workspaces: the image in the log (``adapter.image``),
  folded up to the entry (a fork inherits its parent's image up to the fork point with its
  history), a virtual workspace's larger files read from the blob store beside the log;
- checkpoint mode: the checkpoint ``cua.space`` recorded as of the entry, read from a
  ``CheckpointStore`` directory (the driver's, e.g. a campaign run's ``store/``): the tar
  ``checkpoint_export`` writes, a manifest and content-addressed objects, each checked
  against its hash.

Which one applies is what ``cua.space`` says of the conversation's mode as of the entry.
"""

from __future__ import annotations

import hashlib
import json
import tarfile
from dataclasses import dataclass
from pathlib import Path

from ..adapter.checkpoint_store import DirectoryCheckpointStore
from ..adapter.image import Image
from ..adapter.state import SPACE
from ..log import Log
from ..virtual.blob_store import BlobStore, DamagedBlob, blob_dir, image_content


class NoWorkspaceState(Exception):
    """The log holds no workspace for that entry here; the message says what is missing."""


@dataclass(frozen=True)
class FileState:
    #: ``file`` or ``symlink``.
    kind: str
    mode: int
    #: A file's bytes, or a link's target (as bytes).
    data: bytes


#: path -> what is there (files and links; directories follow from the paths).
WorkspaceState = dict[str, FileState]


def state_at(log: Log, conversation: int, entry: int, *, store: Path | None = None
             ) -> tuple[WorkspaceState, str]:
    """The workspace as of ``entry`` (right after it and what committed with it) and where
    it came from."""
    entry = with_its_commit(log, conversation, entry)
    space = SPACE.read(log, conversation, as_of=entry)
    if space.mode == "checkpoint":
        if space.checkpoint is None:
            raise NoWorkspaceState(f"conversation {conversation} records no checkpoint as of "
                                   f"entry {entry} (no call had finished in checkpoint mode)")
        if store is None:
            raise NoWorkspaceState(
                f"conversation {conversation} ran in checkpoint mode at entry {entry}; its "
                f"workspace is checkpoint {space.checkpoint.id}: pass --store DIR, the "
                "driver's CheckpointStore directory")
        return _from_checkpoint(store, space.checkpoint.id), f"checkpoint {space.checkpoint.id}"
    return _from_image(log, conversation, entry), "the image in the log"


def with_its_commit(log: Log, conversation: int, entry: int) -> int:
    """``entry``, or for a call's result the hidden entries right after it: logs written
    before 2026-12-03 committed a call's image change after its result, in the same
    transaction (now it comes before, and the result's documents are read as of its
    transaction's first entry; what follows a result now is its recovery events)."""
    history = log.entries(conversation)
    ids = [e.id for e in history]
    if entry not in ids:
        raise NoWorkspaceState(f"entry {entry} is not in the history of conversation "
                               f"{conversation}; `python -m durable.review entries` lists them")
    at = ids.index(entry)
    last = entry
    if history[at].kind != "tool_result":
        return last
    for e in history[at + 1:]:
        if e.kind != "system" or not e.data.get("hidden"):
            break
        last = e.id
    return last


def _from_image(log: Log, conversation: int, entry: int) -> WorkspaceState:
    image = Image()
    image.fold_history(log.entries(conversation), upto=entry)
    directory = blob_dir(log.storage)
    store = None if directory is None else BlobStore(directory)
    out: WorkspaceState = {}
    for path, row in sorted(image.table.items()):
        if row.kind == "symlink":
            out[path] = FileState("symlink", 0, row.ident.encode("utf-8", "surrogateescape"))
        elif row.kind == "file":
            try:
                out[path] = FileState("file", row.mode,
                                      image_content(log, image, row.ident, store))
            except DamagedBlob as exc:
                raise NoWorkspaceState(f"{path}: {exc}") from None
    return out


def _from_checkpoint(store: Path, checkpoint_id: str) -> WorkspaceState:
    stream = DirectoryCheckpointStore(store).open(checkpoint_id)
    if stream is None:
        raise NoWorkspaceState(f"the store {store} has no checkpoint {checkpoint_id}; pass "
                               "the store the session's driver kept")
    manifest, objects = None, {}
    with stream, tarfile.open(fileobj=stream, mode="r|") as tar:
        for member in tar:
            src = tar.extractfile(member)
            if src is None:
                continue
            data = src.read()
            if member.name == "manifest.json":
                manifest = json.loads(data)
            elif member.name.startswith("objects/"):
                objects[member.name[len("objects/"):]] = data
    if manifest is None:
        raise NoWorkspaceState(f"checkpoint {checkpoint_id} in {store} has no manifest")
    out: WorkspaceState = {}
    for f in manifest["files"]:
        data = objects.get(f["sha256"], b"")
        if hashlib.sha256(data).hexdigest() != f["sha256"]:
            raise NoWorkspaceState(f"checkpoint {checkpoint_id}: the object of {f['path']} "
                                   "is missing or damaged in the store")
        out[f["path"]] = FileState("file", int(f["mode"]) & 0o7777, data)
    for path, target in manifest["symlinks"].items():
        out[path] = FileState("symlink", 0, str(target).encode())
    return dict(sorted(out.items()))


def unified_diff(a: WorkspaceState, b: WorkspaceState, *, a_name: str = "a",
                 b_name: str = "b") -> str:
    """The change from ``a`` to ``b`` as a unified diff; a binary file is named, not shown,
    and a change of mode or link target gets a line of its own."""
    import difflib

    out: list[str] = []
    for path in sorted(set(a) | set(b)):
        old, new = a.get(path), b.get(path)
        if old == new:
            continue
        if old is not None and new is not None and old.data == new.data:
            out.append(f"mode {path}: {old.mode:o} -> {new.mode:o}\n")
            continue
        if (old and old.kind == "symlink") or (new and new.kind == "symlink"):
            def show(s: FileState | None) -> str:
                return "absent" if s is None else (
                    f"-> {s.data.decode(errors='replace')}" if s.kind == "symlink"
                    else "a file")
            out.append(f"link {path}: {show(old)} => {show(new)}\n")
            continue
        texts: list[list[str] | None] = []
        for s in (old, new):
            if s is not None and b"\0" in s.data[:8000]:  # binary, as git tells it
                texts.append(None)
                continue
            try:
                texts.append([] if s is None else s.data.decode("utf-8").splitlines(True))
            except UnicodeDecodeError:
                texts.append(None)
        if texts[0] is None or texts[1] is None:
            out.append(f"Binary files {a_name}/{path} and {b_name}/{path} differ\n")
            continue
        lines = list(difflib.unified_diff(
            texts[0], texts[1], fromfile="/dev/null" if old is None else f"{a_name}/{path}",
            tofile="/dev/null" if new is None else f"{b_name}/{path}"))
        out += [line if line.endswith("\n") else line + "\n\\ No newline at end of file\n"
                for line in lines]
    return "".join(out)


def extract(state: WorkspaceState, dest: Path) -> int:
    """Write ``state`` under ``dest`` (which must not exist or be empty); how many paths.

    The state comes from a log, which is input: a path that is empty, absolute, has ``.``
    or ``..`` parts, or is both a file and a directory is refused (``NoWorkspaceState``);
    set-id and sticky bits are not written (a review run as root must not leave a setuid
    file behind)."""
    dest.mkdir(parents=True, exist_ok=True)
    if any(dest.iterdir()):
        raise NoWorkspaceState(f"{dest} is not empty; give a new directory")
    for path, s in state.items():
        parts = path.split("/")
        if not path or path.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise NoWorkspaceState(f"path {path!r} is not a relative path of the workspace; "
                                   "the log is damaged")
        target = dest / path
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            if s.kind == "symlink":
                target.symlink_to(s.data.decode("utf-8", "surrogateescape"))
            else:
                target.write_bytes(s.data)
                target.chmod(s.mode & 0o777)
        except (FileExistsError, NotADirectoryError, IsADirectoryError) as exc:
            raise NoWorkspaceState(f"path {path!r} is both a file and a directory of the "
                                   f"state ({exc.strerror}); the log is damaged") from None
    return len(state)
