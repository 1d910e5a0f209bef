"""The cost benchmark's measurement: what one tool call costs with and without the adapter.

A *cell* is one (backend, mode, workspace size): its own SQLite log, harness, scripted model
and Space, seeded with ``files`` files of 4 KiB through the Space client (or, unwrapped,
through ``LocalEnv``) before anything is timed. Modes: ``unwrapped`` (the harness on
``LocalEnv``, no adapter, no Space: the baseline), ``transactional``, ``checkpoint`` (workspace
snapshots kept in the Space), ``checkpoint+store`` (also copied to a
``DirectoryCheckpointStore``), ``auto`` and, on microVMs, ``machine`` (checkpoint mode with
whole-machine snapshots, ``SandboxSnapshots``).

What is timed: from the start of the call's intent commit to the end of its result commit,
read off the storage (``MeteredStorage``), so the model turns around the call are not in it
but everything the adapter adds (scans, start marks, checkpoints, the image diff committed
with the result) is.

What is weighed: the log's growth, as the SQLite file's size after a
``wal_checkpoint(TRUNCATE)`` taken after every call (outside the timed window; it also keeps
SQLite's own auto-checkpoint from landing inside one). The growth is page-quantised (4 KiB
pages), so a single call shows 0 or whole pages; the report uses the mean over a cell. It
counts everything the call's submission committed (the input, two model turns, the call):
the unwrapped row is that baseline.

Interleaving: the machine is shared and noisy, so cells are not measured one after the
other. Each round makes one call of each kind in every cell, the cells (and the kinds)
starting one further along each round, so a burst of noise hits every cell alike.

The scripted model plays a plan that grows one call per submission: ``ScriptedModel`` reads
its next step from the messages and the plan list, so appending to the list is how one
conversation takes calls one at a time.
"""

from __future__ import annotations

import sqlite3
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from chaos.errors import BackendUnavailable
from chaos.space_providers import make_spaces
from durable.adapter import (
    SPACE_DOC,
    DirectoryCheckpointStore,
    SnapshotProvider,
    TransactionalLimits,
    WorkspaceSnapshots,
    durable_spaces,
)
from durable.coding_tools import coding_tools
from durable.env import LocalEnv
from durable.errors import SpaceError
from durable.harness import Conversation, Harness
from durable.models import PlannedCall, ScriptedModel
from durable.spaces import Spaces
from durable.storage import Batch, Snapshot, SqliteStorage
from durable.storage.records import DocRecord
from durable.tools import ToolRegistry

MODES = ("unwrapped", "transactional", "checkpoint", "checkpoint+store", "auto", "machine")
#: The adapter mode each benchmark mode asks for (what ``effective_mode`` is compared to).
ADAPTER_MODE = {"unwrapped": "unwrapped", "transactional": "transactional",
                "checkpoint": "checkpoint", "checkpoint+store": "checkpoint", "auto": "auto",
                "machine": "checkpoint"}
#: Modes only some backends have: whole-machine checkpoints need a microVM.
ONLY_ON = {"machine": "microvm"}
KINDS = ("write", "edit", "bash")
SIZES = (10, 100, 1000)
FILE_SIZE = 4096
EDIT_PATH = "seed/f0000.txt"
WRITE_PATH = "written.txt"
APPEND = "printf 'x\\n' >> log.txt"


@dataclass(frozen=True)
class Sample:
    """One timed call. ``log_bytes`` is the log file's growth over the call's submission."""

    backend: str
    mode: str
    files: int
    kind: str
    round: int
    call: int
    ms: float
    log_bytes: int
    effective_mode: str


class MeteredStorage:
    """A ``Storage`` around another that notes when a call's intent commit starts (the
    first batch that marks a slot ``running``) and when its result commit ends (the batch
    holding the ``tool_result`` entry). ``reset`` before each call."""

    def __init__(self, inner: SqliteStorage) -> None:
        self.inner = inner
        self.intent_at: float | None = None
        self.result_at: float | None = None

    def reset(self) -> None:
        self.intent_at = self.result_at = None

    def load(self) -> Snapshot:
        return self.inner.load()

    def load_docs(self, conversation: int, kind: str) -> list[DocRecord]:
        return self.inner.load_docs(conversation, kind)

    def commit(self, batch: Batch) -> None:
        if self.intent_at is None and any(s.state == "running" for s in batch.slots):
            self.intent_at = time.perf_counter()
        self.inner.commit(batch)
        if any(e.kind == "tool_result" for e in batch.entries):
            self.result_at = time.perf_counter()

    def close(self) -> None:
        self.inner.close()


def _seed_file(i: int) -> tuple[str, bytes]:
    head = b"counter=0\n" if i == 0 else f"file {i}\n".encode()
    return f"seed/f{i:04d}.txt", head + b"." * (FILE_SIZE - len(head))


@dataclass
class Cell:
    """One (backend, mode, files) with its log, harness and growing plan."""

    backend: str
    mode: str
    files: int
    harness: Harness
    conversation: Conversation
    storage: MeteredStorage
    log_path: Path
    plan: list[PlannedCall]
    adapter: bool
    calls: int = 0
    edits: int = 0
    #: The ``checkpoint+store`` cell's CheckpointStore directory (None in the others).
    store_dir: Path | None = None
    _wal: sqlite3.Connection | None = field(default=None, repr=False)

    def _args(self, kind: str) -> tuple[str, dict[str, Any]]:
        if kind == "write":
            head = f"write {self.calls}\n"
            return "write", {"path": WRITE_PATH, "content": head + "w" * (FILE_SIZE - len(head))}
        if kind == "edit":
            self.edits += 1
            return "edit", {"path": EDIT_PATH, "edits": [
                {"old_text": f"counter={self.edits - 1}\n", "new_text": f"counter={self.edits}\n"}]}
        return "bash", {"command": APPEND}

    def log_size(self) -> int:
        """The log file's size once the WAL is folded into it."""
        if self._wal is None:
            self._wal = sqlite3.connect(self.log_path)
        busy, _, _ = self._wal.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        if busy:
            raise RuntimeError(f"{self.log_path}: the WAL could not be checkpointed (busy)")
        return self.log_path.stat().st_size

    def call(self, kind: str, round_no: int) -> Sample:
        """Make one ``kind`` call in its own submission and measure it."""
        tool, args = self._args(kind)
        self.plan.append(PlannedCall(len(self.plan), tool, args))
        before = self.log_size()
        self.storage.reset()
        outcome = self.conversation.submit(content=f"{kind} #{self.calls}",
                                           request_id=f"bench-{self.calls}").wait()
        if not outcome.done:
            raise RuntimeError(f"{self.label}: the submission of call {self.calls} ended "
                               f"{outcome.state}: {outcome.reason}")
        result = next(e for e in reversed(self.conversation.entries())
                      if e.kind == "tool_result")
        if result.data["is_error"]:
            raise RuntimeError(f"{self.label}: the {kind} call failed: {result.data['content']}")
        assert self.storage.intent_at is not None and self.storage.result_at is not None
        ms = (self.storage.result_at - self.storage.intent_at) * 1000
        sample = Sample(self.backend, self.mode, self.files, kind, round_no, self.calls, ms,
                        self.log_size() - before, self.effective_mode())
        self.calls += 1
        return sample

    def effective_mode(self) -> str:
        """The adapter mode the conversation runs in now (auto may have switched)."""
        if not self.adapter:
            return self.mode
        mode: str = self.harness.log.read_doc(self.conversation.id, SPACE_DOC).value["mode"]
        return mode

    @property
    def label(self) -> str:
        return f"{self.backend}/{self.mode}/{self.files} files"

    def close(self) -> None:
        if self._wal is not None:
            self._wal.close()
        self.harness.close()


def _open_cell(backend: str, mode: str, files: int, spaces: Spaces, work: Path,
               created: list[str]) -> Cell:
    slug = f"{backend}-{mode.replace('+', '-')}-{files}"
    home = work / slug
    home.mkdir(parents=True)
    log_path = home / "log.sqlite"
    storage = MeteredStorage(SqliteStorage(log_path))
    plan: list[PlannedCall] = []
    registry = ToolRegistry(coding_tools())
    seed = [_seed_file(i) for i in range(files)]
    if mode == "unwrapped":
        env = LocalEnv(home / "workspace")
        for path, data in seed:
            env.write_file(path, data)
        harness = Harness.open(storage, models=ScriptedModel(plan), registry=registry, env=env)
        return Cell(backend, mode, files, harness, harness.root("bench"), storage, log_path,
                    plan, adapter=False)
    store_dir = home / "store" if mode == "checkpoint+store" else None
    store = None if store_dir is None else DirectoryCheckpointStore(store_dir)
    # Transactional is measured within its limits; auto keeps the defaults, so the
    # report shows where it switches to checkpoint.
    limits = TransactionalLimits(max_files=files + 100) if mode == "transactional" else None
    if mode == "machine":
        from backends.microvm import MicroVMSpaces, SandboxSnapshots

        assert isinstance(spaces, MicroVMSpaces)
        snapshots: SnapshotProvider = SandboxSnapshots(spaces)
    else:
        snapshots = WorkspaceSnapshots(spaces, "", store)
    adapter = durable_spaces(session=slug, spaces=spaces, snapshots=snapshots,
                             mode=ADAPTER_MODE[mode], epoch=1, fence=None, space_prefix="cost",
                             transactional=limits)
    registry.extend(adapter.extension)
    harness = Harness.open(storage, models=ScriptedModel(plan), registry=registry,
                           env=adapter.env)
    conversation = harness.root("bench")
    name = adapter.space_name(conversation.id)
    spaces.create(name)
    created.append(name)
    client = spaces.connect(name, epoch=0)
    for path, data in seed:
        client.write_file(path, data)
    return Cell(backend, mode, files, harness, conversation, storage, log_path, plan,
                adapter=True, store_dir=store_dir)


def backend_spaces(backend: str, work: Path) -> Spaces:
    """The backend's ``Spaces``, proven by creating and deleting a probe Space; raises
    ``BackendUnavailable`` with the reason when it cannot be had."""
    try:
        spaces = make_spaces(backend, work / f"spaces-{backend}")
        spaces.create("cost-probe")
        spaces.delete("cost-probe")
    except SpaceError as exc:
        raise BackendUnavailable(f"a {backend} Space could not be created: {exc}") from exc
    return spaces


@contextmanager
def open_cells(backend: str, spaces: Spaces, modes: tuple[str, ...], sizes: tuple[int, ...],
               work: Path) -> Iterator[list[Cell]]:
    """Every cell of one backend, warmed up (one call of each kind, not recorded: it adopts
    the seeded Space and takes the first scan or checkpoint); closed and their Spaces
    deleted on exit."""
    created: list[str] = []

    def delete_spaces() -> None:
        for name in created:
            spaces.delete(name)

    with ExitStack() as stack:
        stack.callback(delete_spaces)
        cells = []
        for mode in modes:
            if ONLY_ON.get(mode, backend) != backend:
                continue  # e.g. machine snapshots off a microVM
            for files in sizes:
                cell = _open_cell(backend, mode, files, spaces, work, created)
                stack.callback(cell.close)
                for kind in KINDS:
                    cell.call(kind, -1)
                cells.append(cell)
        yield cells


def measure(cells: list[Cell], repeat: int,
            progress: Callable[[str], None] = lambda line: print(line, file=sys.stderr)
            ) -> list[dict[str, Any]]:
    """``repeat`` interleaved rounds over ``cells``; every sample as a dict."""
    samples: list[dict[str, Any]] = []
    t0 = time.monotonic()
    for r in range(repeat):
        order = cells[r % len(cells):] + cells[:r % len(cells)]
        kinds = KINDS[r % len(KINDS):] + KINDS[:r % len(KINDS)]
        for cell in order:
            for kind in kinds:
                samples.append(asdict(cell.call(kind, r)))
        progress(f"cost: round {r + 1}/{repeat} done ({time.monotonic() - t0:.0f} s)")
    return samples
