"""``python -m durable.review entries|diff|show|fork``: what an agent changed, from its log.

    entries LOG CONVERSATION                       the entries (id, kind, what)
    diff LOG CONVERSATION ENTRY_A ENTRY_B          the workspace change from A to B
    show LOG CONVERSATION ENTRY --to DIR           the workspace as the agent saw it before
                                                   ENTRY (its decision), written to DIR
    fork LOG CONVERSATION ENTRY --spaces M:F ...   a conversation forked at ENTRY with a
                                                   Space of its own built from that state

``LOG`` is a SQLite log file or a JSONL log directory. The workspace as of an entry comes
from the image in the log (transactional mode) or from the checkpoint the log recorded
(checkpoint mode; ``--store DIR``, the driver's CheckpointStore). Exit codes: 0, 1 when the
log holds no workspace for what was asked (the message says what is missing), 254 bad
arguments.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from pathlib import Path
from typing import Any

from ..adapter import DirectoryCheckpointStore, WorkspaceSnapshots, durable_spaces
from ..errors import DurableError
from ..log import Log
from ..session_log import open_log_at
from ..spaces import ShellReachable
from ..spaces_loader import BadProvider, load_spaces, pairs
from ..storage.base import Storage
from .workspace_state import NoWorkspaceState, extract, state_at, unified_diff, with_its_commit

EXIT_BAD_ARGS = 254


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m durable.review", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)

    def base(name: str, help_: str) -> argparse.ArgumentParser:
        c = sub.add_parser(name, help=help_)
        c.add_argument("log", type=Path)
        c.add_argument("conversation", type=int)
        c.add_argument("--store", type=Path, default=None,
                       help="the driver's CheckpointStore directory (checkpoint mode)")
        return c

    base("entries", "list a conversation's entries")
    d = base("diff", "the workspace change between two entries")
    d.add_argument("entry_a", type=int)
    d.add_argument("entry_b", type=int)
    s = base("show", "the workspace before an entry, written to a directory")
    s.add_argument("entry", type=int)
    s.add_argument("--to", type=Path, required=True, help="a new or empty directory")
    f = base("fork", "a conversation forked at an entry, with a Space built from its state")
    f.add_argument("entry", type=int)
    f.add_argument("--spaces", required=True, metavar="MODULE:FACTORY",
                   help="the Spaces provider, e.g. backends.local:LocalSpaces")
    f.add_argument("--spaces-arg", action="append", default=[], metavar="KEY=VALUE")
    f.add_argument("--session", default=None,
                   help="the session name the fork's Space is named from (default: one per "
                        "log, from its path)")
    f.add_argument("--mode", default="auto", choices=("auto", "transactional", "checkpoint"))
    return p


def _storage(path: Path) -> Storage:
    if not path.exists():
        raise NoWorkspaceState(f"no log at {path}; pass a SQLite log file or a JSONL log "
                               "directory")
    return open_log_at(path)


def main(argv: list[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:
        return EXIT_BAD_ARGS if exc.code else 0
    try:
        log = Log.open(_storage(args.log))
    except (NoWorkspaceState, DurableError) as exc:
        print(f"durable.review: {exc}", file=sys.stderr)
        return 1
    try:
        return _run(args, log)
    except BrokenPipeError:  # `... entries LOG 1 | head`: the reader has what it wanted
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - nothing more may reach the pipe
        return 0
    except (NoWorkspaceState, DurableError, ValueError) as exc:
        print(f"durable.review: {exc}", file=sys.stderr)
        return EXIT_BAD_ARGS if isinstance(exc, BadProvider) else 1
    finally:
        log.close()


def _what(kind: str, d: dict[str, Any]) -> str:
    """One line saying what an entry is."""
    def first(text: str) -> str:
        lines = str(text).strip().splitlines()
        return lines[0] if lines else "(empty)"

    if kind == "assistant":
        calls = ", ".join(f"{c['name']}({', '.join(sorted(c.get('args', {})))})"
                          for c in d.get("tool_calls", []))
        return " ".join(x for x in (first(d.get("text", "")) if d.get("text") else "",
                                    f"calls {calls}" if calls else "") if x) or "(no text)"
    if kind == "tool_result":
        flag = " [error]" if d.get("is_error") else " [interrupted]" if d.get("interrupted") \
            else ""
        return f"{d.get('name')}{flag}: {first(d.get('content', ''))}"
    if kind == "system" and d.get("hidden"):
        return "adapter: " + ", ".join(k for k in sorted(d) if k != "hidden")
    return first(d.get("content", ""))


def _before(log: Log, conversation: int, entry: int) -> int:
    """The entry just before ``entry`` in the conversation's history; for a call's result,
    before the hidden entries committed with it (its image change comes right before it)."""
    history = log.entries(conversation)
    ids = [e.id for e in history]
    if entry not in ids:
        raise NoWorkspaceState(f"entry {entry} is not in the history of conversation "
                               f"{conversation}; `python -m durable.review entries` lists them")
    at = ids.index(entry)
    if history[at].kind == "tool_result":
        while at > 0 and history[at - 1].kind == "system" and history[at - 1].data.get("hidden"):
            at -= 1
    if at == 0:
        raise NoWorkspaceState(f"entry {entry} is the conversation's first: nothing came "
                               "before it")
    return ids[at - 1]


def _run(args: argparse.Namespace, log: Log) -> int:
    conv = args.conversation
    if not log.has_conversation(conv):
        raise NoWorkspaceState(f"the log has no conversation {conv}")
    if args.command == "entries":
        for e in log.entries(conv):
            print(f"{e.id:>6}  {e.kind:<12} {_what(e.kind, e.data)[:90]}")
        return 0
    if args.command == "diff":
        a, source_a = state_at(log, conv, args.entry_a, store=args.store)
        b, source_b = state_at(log, conv, args.entry_b, store=args.store)
        print(f"# entry {args.entry_a} ({source_a}) -> entry {args.entry_b} ({source_b})")
        sys.stdout.write(unified_diff(a, b, a_name=f"entry-{args.entry_a}",
                                      b_name=f"entry-{args.entry_b}"))
        return 0
    if args.command == "show":
        before = _before(log, conv, args.entry)
        state, source = state_at(log, conv, before, store=args.store)
        n = extract(state, args.to)
        print(f"{n} path(s) as of entry {before} (before entry {args.entry}; {source}) "
              f"written to {args.to}")
        return 0
    return _fork(args, log)


def _fork(args: argparse.Namespace, log: Log) -> int:
    spaces = load_spaces(args.spaces, pairs(args.spaces_arg, "--spaces-arg"))
    # What the fork starts from must be there before anything is made: a conversation once
    # forked stays in the log (it cannot be taken back).
    state_at(log, args.conversation, args.entry, store=args.store)
    conv = log.fork(args.conversation, with_its_commit(log, args.conversation, args.entry))
    store = DirectoryCheckpointStore(args.store) if args.store else None
    adapter = durable_spaces(session=args.session or _session_of(args.log), spaces=spaces,
                             snapshots=WorkspaceSnapshots(spaces, "", store), mode=args.mode,
                             epoch=_epoch_above(log), fence=None)
    name = adapter.space_name(conv)
    try:
        client = adapter.space.ensure(log, conv, check_exists=True).client
        entries = len(client.scan().entries)
    except BaseException:
        # Neither a Space nor its daemon is left behind; the conversation stays, inert.
        try:
            spaces.delete(name)
        except Exception as exc:  # noqa: BLE001 - the build's error is the one to report
            print(f"durable.review: the Space {name} could not be removed either ({exc}); "
                  "delete it with its provider", file=sys.stderr)
        print(f"durable.review: conversation {conv} was forked in the log, but its Space "
              f"{name} could not be built (removed again); the conversation stays in the log "
              "with no entries of its own: fork again once the cause below is fixed",
              file=sys.stderr)
        raise
    print(f"conversation {conv} forked from {args.conversation} at entry {args.entry}; "
          f"its Space {name} holds the workspace as of that entry ({entries} entries)")
    print(f"  open a shell in it: {_shell_hint(spaces, name)}")
    return 0


def _session_of(log_path: Path) -> str:
    """The default session a fork's Space is named from: one per log (the forks of two
    logs never share a Space name), from the log's absolute path."""
    digest = hashlib.sha256(str(log_path.resolve()).encode()).hexdigest()[:10]
    return f"review-{digest}"


def _epoch_above(log: Log) -> int:
    """An epoch above every driver's that wrote the log (its entries carry theirs)."""
    history = getattr(log.storage, "epoch_history", None)
    if history is None:
        return 1
    got = history()
    epochs = [e for e in got.entry_epochs.values() if e] + [r[0] for r in got.raises]
    return max(epochs, default=0) + 1


def _shell_hint(spaces: object, name: str) -> str:
    """How a person opens a shell in the Space, as far as the provider says."""
    if isinstance(spaces, ShellReachable):
        return spaces.shell_hint(name)
    return f"none (reach it through its daemon: {type(spaces).__name__}.connect({name!r}, ...))"
