"""What a commit costs on each persistent storage: ``python -m durable.log_bench [--commits N]``.

Measures SQLite unfenced and fenced, JSONL with and without fsync, on the batch a tool call
commits (one entry with ~500 bytes of data, one slot upsert, one document write), and prints
commits/s, the median latency and the fenced/unfenced ratio (the fence must stay cheap: it
adds one single-row read to a transaction that already pays an fsync).

The kinds are interleaved round by round (one commit of each, then the next round, each
round starting with the next kind) rather than run one after the other, so a burst of machine
noise (another process's fsync, a CPU frequency change) hits every kind alike instead of
skewing one of them. It prints numbers and
asserts nothing: timings depend on the disk.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from pathlib import Path

from .storage import (
    Batch,
    ConversationRecord,
    DocRecord,
    EntryRecord,
    JsonlStorage,
    SlotRecord,
    SqliteStorage,
    Storage,
)
from .storage_fences import open_fenced_sqlite

KINDS: dict[str, Callable[[Path], Storage]] = {
    "sqlite": lambda d: SqliteStorage(d / "unfenced.sqlite"),
    "sqlite-fenced": lambda d: open_fenced_sqlite(d / "fenced.sqlite", 1)[0],
    "jsonl-fsync": lambda d: JsonlStorage(d / "jsonl-fsync"),
    "jsonl-nofsync": lambda d: JsonlStorage(d / "jsonl-nofsync", fsync=False),
}

_TEXT = "The tool wrote 42 lines to src/app.py and the tests passed. " * 8  # ~500 bytes


def tool_call_batch(base_id: int, round_no: int) -> Batch:
    """One tool call's commit: its result entry, its slot (new on even rounds, updated on odd
    ones), and the session's progress document."""
    call_id = f"call-{round_no // 2}"
    return Batch(
        base_id=base_id,
        next_id=base_id + 1,
        entries=[EntryRecord(base_id, 1, "tool_result", {"call_id": call_id, "output": _TEXT})],
        slots=[
            SlotRecord(1, call_id, base_id, "bash", {"command": "make test"}, "never",
                       "done" if round_no % 2 else "running", result_entry=base_id)
        ],
        docs=[DocRecord(1, "progress", 1, round_no + 1, {"round": round_no}, base_id)],
    )


def run(commits: int, directory: Path) -> dict[str, list[float]]:
    """Commit ``commits`` batches to each kind, interleaved; the latencies in seconds."""
    latencies: dict[str, list[float]] = {kind: [] for kind in KINDS}
    with ExitStack() as stack:
        storages = {}
        for kind, open_kind in KINDS.items():
            storage = open_kind(directory)
            stack.callback(storage.close)
            root = ConversationRecord(1, "main")
            storage.commit(Batch(base_id=1, next_id=2, conversations=[root]))
            storages[kind] = storage
        kinds = list(storages)
        for round_no in range(commits):
            # Rotate who goes first: a commit pays for what the previous one left behind (an
            # fsync also flushes the journal of the filesystem), so no kind always follows
            # the same other.
            shift = round_no % len(kinds)
            for kind in kinds[shift:] + kinds[:shift]:
                storage = storages[kind]
                batch = tool_call_batch(round_no + 2, round_no)
                start = time.perf_counter()
                storage.commit(batch)
                latencies[kind].append(time.perf_counter() - start)
    return latencies


def report(latencies: dict[str, list[float]]) -> list[str]:
    lines = [f"{'storage':<15}{'commits/s':>12}{'median ms':>12}"]
    for kind, times in latencies.items():
        rate, median_ms = len(times) / sum(times), statistics.median(times) * 1e3
        lines.append(f"{kind:<15}{rate:>12.1f}{median_ms:>12.3f}")
    ratio = statistics.median(latencies["sqlite-fenced"]) / statistics.median(latencies["sqlite"])
    lines.append(f"fenced/unfenced median latency ratio: {ratio:.2f}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m durable.log_bench", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--commits", type=int, default=300, help="commits per storage (default 300)"
    )
    parser.add_argument(
        "--dir", type=Path, default=None,
        help="the filesystem to measure: the logs go to a temporary directory made inside it "
        "and removed after (default: the system's temporary directory)",
    )
    args = parser.parse_args(argv)
    if args.commits < 1:
        parser.error(f"--commits must be >= 1, got {args.commits}")
    with tempfile.TemporaryDirectory(prefix="durable-bench-", dir=args.dir) as tmp:
        print(f"durable.log_bench: {args.commits} commits per storage, interleaved, in {tmp}")
        for line in report(run(args.commits, Path(tmp))):
            print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
