"""Where a virtual workspace's files are kept between calls: in the log (durable) or in
memory for the current turn (scratch).

Durable: a conversation's workspace is the image its history holds (``adapter.image``: a
hidden entry per change with the paths set and deleted), the very format transactional
mode keeps a Space's workspace in, so ``durable.review`` reads both alike. A call's change
is appended in the transaction that commits its result (``CallContext.on_result``): a call
cut off before that left nothing, and runs again from the same files. Contents up to
``inline_bytes`` are kept in the entry, larger ones in the blob store beside the log
(``blob_store``), written before the commit.

Scratch: the same tools on files in memory that last one turn (the input the call answers);
nothing reaches the log, and a crashed driver's files are gone.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from ..adapter import image as img
from ..failpoints import failpoint
from ..log import Log
from ..tools import CallContext
from .blob_store import BlobStore, blob_dir, image_content
from .shell import Node, ShellLimits, Tree


@dataclass(frozen=True)
class VirtualLimits:
    #: Files and symlinks a workspace may hold (about 500 is what it is made for).
    max_files: int = 500
    #: Bytes of file content a workspace may hold.
    max_bytes: int = 64 * 1024 * 1024
    #: Contents up to this size live in the log's entries; larger ones in the blob store.
    inline_bytes: int = 16 * 1024
    shell: ShellLimits = field(default_factory=ShellLimits)


def over_limits(tree: Tree, limits: VirtualLimits) -> str | None:
    """Why ``tree`` cannot be kept, or None when it can."""
    bad = next((p for p in tree if "\n" in p or "\\" in p), None)
    if bad is not None:
        return (f"the path {bad!r} has a newline or backslash in its name, which a workspace "
                "cannot track; rename it")
    if len(tree) > limits.max_files:
        return (f"the virtual workspace holds at most {limits.max_files} files (max_files) and "
                f"this call would leave {len(tree)}; remove files, or use a Space for larger "
                "workspaces")
    size = sum(len(n.data) for n in tree.values() if n.kind == "file")
    if size > limits.max_bytes:
        return (f"the virtual workspace holds at most {limits.max_bytes} bytes (max_bytes) and "
                f"this call would leave {size}; remove files, or use a Space for larger "
                "workspaces")
    return None


def rows_of(tree: Tree) -> dict[str, img.Row]:
    """The image rows of a virtual tree: its files and symlinks, and the directories their
    paths imply (0755; it keeps no empty directory, no mtime, no hardlink, no FIFO: the
    table of docs/workloads.md says what each kind of workspace keeps)."""
    rows = {p: img.Row("symlink", 0, n.data.decode("utf-8", "surrogateescape"))
            if n.kind == "symlink" else img.Row("file", n.mode, hashlib.sha256(n.data).hexdigest())
            for p, n in tree.items()}
    for path in list(rows):
        parent = path.rpartition("/")[0]
        while parent and parent not in rows:
            rows[parent] = img.Row("dir", 0o755, "")
            parent = parent.rpartition("/")[0]
    return rows


class LogWorkspaces:
    """Each conversation's workspace as its log holds it (see the module docstring).
    ``initial``: the files a conversation starts with, until its first change commits."""

    durable = True

    def __init__(self, limits: VirtualLimits, initial: Tree | None = None) -> None:
        self.limits = limits
        self.initial = dict(initial or {})
        self._images: dict[tuple[int, int], img.Image] = {}
        self._contents: dict[str, bytes] = {}

    def image(self, log: Log, conversation: int) -> img.Image:
        """The conversation's image, folded up to the newest committed entry."""
        image = self._images.setdefault((id(log), conversation), img.Image())
        image.fold_history(log.entries(conversation))
        return image

    def tree(self, log: Log, conversation: int) -> Tree:
        """The files as of the last committed change (``initial`` before any)."""
        image = self.image(log, conversation)
        if image.upto == 0 and not image.table:
            return dict(self.initial)
        store = self._store(log)
        out: Tree = {}
        for path, row in image.table.items():
            if row.kind == "dir":
                continue  # implied by the paths under it
            if row.kind == "symlink":
                out[path] = Node("symlink", 0, row.ident.encode("utf-8", "surrogateescape"))
                continue
            data = self._contents.get(row.ident)
            if data is None:
                data = image_content(log, image, row.ident, store)
                self._contents[row.ident] = data
            out[path] = Node("file", row.mode, data)
        return out

    def record(self, ctx: CallContext, after: Tree) -> None:
        """Commit the change from the log's files to ``after`` with the call's result."""
        data = self._change(ctx.log, ctx.conversation, after, ctx.call_id)
        if data is not None:
            ctx.record_before_result(lambda tx: tx.append(ctx.conversation, "system", data))

    def seed(self, log: Log, conversation: int) -> None:
        """Commit ``initial`` as the conversation's files if nothing was committed yet (the
        session driver does, before the first turn, so the log holds them from the start)."""
        image = self.image(log, conversation)
        if image.upto or image.table or not self.initial:
            return
        data = self._change(log, conversation, self.initial, None)
        if data is not None:
            with log.transaction() as tx:
                tx.append(conversation, "system", data)

    def _change(self, log: Log, conversation: int, after: Tree,
                call_id: str | None) -> dict[str, Any] | None:
        """The hidden entry that turns the log's files into ``after`` (None: no change),
        its larger contents already in the blob store."""
        image = self.image(log, conversation)
        d = img.diff(image, rows_of(after))
        if not d:
            return None
        store = self._store(log)
        inline: dict[str, bytes] = {}
        external: list[str] = []
        by_sha = {hashlib.sha256(n.data).hexdigest(): n.data for n in after.values()
                  if n.kind == "file"}
        for sha in d.new_blobs(image):
            data = by_sha[sha]
            if store is not None and len(data) > self.limits.inline_bytes:
                store.put(data)
                external.append(sha)
            else:
                inline[sha] = data
            self._contents[sha] = data
        if external:
            failpoint("virtual.blobs_written", call=call_id, blobs=len(external))
        return img.payload(d, inline, call_id=call_id, external=tuple(external))

    @staticmethod
    def _store(log: Log) -> BlobStore | None:
        directory = blob_dir(log.storage)
        return None if directory is None else BlobStore(directory)


class ScratchWorkspaces:
    """Each conversation's files in memory, for the turn (the input) its calls answer."""

    durable = False

    def __init__(self, limits: VirtualLimits) -> None:
        self.limits = limits
        self._trees: dict[tuple[int, int], tuple[int, Tree]] = {}

    def tree(self, log: Log, conversation: int, turn: int) -> Tree:
        held = self._trees.get((id(log), conversation))
        return dict(held[1]) if held is not None and held[0] == turn else {}

    def keep(self, log: Log, conversation: int, turn: int, after: Tree) -> None:
        self._trees[(id(log), conversation)] = (turn, dict(after))


def turn_of(ctx: CallContext) -> int:
    """The turn a call belongs to: the input its conversation answers (0 before any)."""
    entry = ctx.log.last_entry(ctx.conversation,
                               lambda e: e.kind == "input" and e.id < ctx.slot.assistant_entry)
    return 0 if entry is None else entry.id
