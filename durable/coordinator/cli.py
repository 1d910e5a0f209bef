"""``python -m durable.coordinator serve|submit|status|sessions|cancel``.

The store is ``--store`` (``CUA_COORDINATOR_STORE``; default ``coordinator.sqlite`` here):
a SQLite file, or ``postgresql://user:password@host:port/db[?schema=NAME]`` for several
coordinators on several machines. ``serve`` needs the Spaces provider its sessions' Spaces
live in, named as ``MODULE:FACTORY`` with ``--spaces-arg KEY=VALUE`` arguments (for example
``backends.local:LocalSpaces --spaces-arg base_dir=/var/lib/spaces``); ``durable`` never
imports a backend itself.

Exit codes: 0 done, 1 an unknown session, 254 bad arguments (one line saying what).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from typing import Any

from ..lifetime import DIE_WITH_ENV, die_with
from ..spaces_loader import BadProvider, load_spaces, pairs
from .coordinator import Backoff, Coordinator, CoordinatorConfig
from .records import (
    CoordinatorError,
    SessionRecord,
    SessionSpec,
    StoreUnavailable,
    UnknownSession,
)
from .store import CoordinatorStore, open_store

STORE_ENV = "CUA_COORDINATOR_STORE"
EXIT_BAD_ARGS = 254


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m durable.coordinator", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--store", default=os.environ.get(STORE_ENV, "coordinator.sqlite"),
                   help=f"the store (env {STORE_ENV}; default coordinator.sqlite)")
    sub = p.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="drive sessions until stopped (SIGTERM, Ctrl-C)")
    serve.add_argument("--spaces", required=True, metavar="MODULE:FACTORY",
                       help="the Spaces provider, e.g. backends.local:LocalSpaces")
    serve.add_argument("--spaces-arg", action="append", default=[], metavar="KEY=VALUE")
    serve.add_argument("--id", default=None,
                       help="this coordinator's name in the store (default: unique per "
                            "process); restarted with the same id it takes its sessions "
                            "back at once")
    serve.add_argument("--host", default=None,
                       help="the host its drivers run on, as recorded with them (default: "
                            "this machine's name); a driver orphaned by a coordinator's death "
                            "or lapsed claim is ended only by a coordinator of its host, so "
                            "give coordinators that share a store but not a process table "
                            "(containers) names of their own")
    serve.add_argument("--max-attempts", type=int, default=10)
    serve.add_argument("--backoff", type=float, default=2.0, help="seconds before the first "
                       "retry after a crash (doubling, capped; 0: at once)")
    serve.add_argument("--backoff-factor", type=float, default=2.0)
    serve.add_argument("--backoff-cap", type=float, default=60.0)
    serve.add_argument("--stall-secs", type=float, default=120.0)
    serve.add_argument("--heartbeat-secs", type=float, default=None,
                       help="the drivers' heartbeat interval (default stall-secs / 4)")
    serve.add_argument("--poll-secs", type=float, default=1.0)
    serve.add_argument("--claim-secs", type=float, default=15.0)
    serve.add_argument("--lease-days", type=float, default=7.0)
    serve.add_argument("--max-drives", type=int, default=4,
                       help="sessions this coordinator drives at once")
    serve.add_argument("--until-idle", action="store_true",
                       help="exit once every session in the store has ended")

    submit = sub.add_parser("submit", help="add a session (idempotent for the same spec)")
    submit.add_argument("name")
    submit.add_argument("--space", required=True, help="the durable Space it runs in")
    submit.add_argument("--state-dir", required=True, help="where its log lives")
    submit.add_argument("--input", default="")
    submit.add_argument("--mode", default="auto", choices=("auto", "transactional",
                                                           "checkpoint"))
    submit.add_argument("--no-checkpoint-store", action="store_true",
                        help="the driver keeps checkpoints only inside the Space: a lost "
                             "Space ends a checkpoint-mode session")
    submit.add_argument("--env", action="append", default=[], metavar="KEY=VALUE")
    submit.epilog = "The driver's command follows a --: submit NAME ... -- python -m app.driver"

    status = sub.add_parser("status", help="each session's state, or one with its events")
    status.add_argument("name", nargs="?")
    status.add_argument("--json", action="store_true")
    sessions = sub.add_parser("sessions", help="the sessions' names and states")
    sessions.add_argument("--json", action="store_true")
    cancel = sub.add_parser("cancel", help="end a session (its driver is killed)")
    cancel.add_argument("name")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    driver: list[str] = []
    if "--" in argv:  # submit's driver command: everything after the first --
        at = argv.index("--")
        argv, driver = argv[:at], argv[at + 1:]
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:
        return EXIT_BAD_ARGS if exc.code else 0
    args.driver = driver
    try:
        # Only the commands that add or drive sessions make a store where there is none.
        store = open_store(args.store, create=args.command in ("submit", "serve"))
    except CoordinatorError as exc:
        print(f"durable.coordinator: {exc}", file=sys.stderr)
        return EXIT_BAD_ARGS
    try:
        return _run(args, store)
    except UnknownSession as exc:
        print(f"durable.coordinator: {exc}", file=sys.stderr)
        return 1
    except StoreUnavailable as exc:
        print(f"durable.coordinator: {exc}. Its drivers were ended and its sessions wait in "
              "the store: start the coordinator again once the store answers",
              file=sys.stderr)
        return 1
    except (BadProvider, ValueError, CoordinatorError) as exc:
        print(f"durable.coordinator: {exc}", file=sys.stderr)
        return EXIT_BAD_ARGS
    finally:
        store.close()


def _run(args: argparse.Namespace, store: CoordinatorStore) -> int:
    if args.command == "serve":
        return _serve(args, store)
    if args.command == "submit":
        spec = SessionSpec(args.name, args.space, tuple(args.driver), args.state_dir, args.input,
                           args.mode, not args.no_checkpoint_store, pairs(args.env, "--env"))
        rec = store.submit(spec, time.time())
        print(f"{rec.name} {rec.state}")
        return 0
    if args.command == "cancel":
        rec = store.cancel(args.name, time.time())
        said = "cancel requested" if rec.cancel_requested and not rec.ended else rec.reason
        print(f"{rec.name} {rec.state}: {said}")
        return 0
    if args.command == "status" and args.name:
        rec = store.get(args.name)
        events = store.events(args.name)
        if args.json:
            print(json.dumps({"session": rec.to_json(),
                              "events": [e.to_json() for e in events]}, indent=2))
            return 0
        print(_table([rec]))
        for e in events[-30:]:
            print(f"  {time.strftime('%H:%M:%S', time.localtime(e.at))} {e.kind} "
                  f"{json.dumps(e.data, sort_keys=True)}")
        return 0
    recs = store.sessions()
    if args.json:
        print(json.dumps([r.to_json() for r in recs], indent=2))
    elif args.command == "sessions":
        for r in recs:
            print(f"{r.name} {r.state}")
    else:
        print(_table(recs))
    return 0


def _table(recs: list[SessionRecord]) -> str:
    now = time.time()
    rows = [("SESSION", "STATE", "ATTEMPTS", "EPOCH", "LAST EXIT", "NEXT RETRY", "REASON")]
    for r in recs:
        retry = "" if r.state != "backoff" or r.next_retry is None else \
            f"in {max(0.0, r.next_retry - now):.1f}s"
        rows.append((r.name, r.state, str(r.attempts), str(r.epoch),
                     "" if r.last_exit is None else str(r.last_exit), retry, r.reason))
    widths = [max(len(row[i]) for row in rows) for i in range(6)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row[:6], widths, strict=True))
                     + "  " + row[6] for row in rows)


def _serve(args: argparse.Namespace, store: CoordinatorStore) -> int:
    die_with(os.environ.get(DIE_WITH_ENV))
    config = CoordinatorConfig(
        max_attempts=args.max_attempts,
        backoff=Backoff(args.backoff, args.backoff_factor, args.backoff_cap),
        stall_secs=args.stall_secs, heartbeat_secs=args.heartbeat_secs,
        poll_secs=args.poll_secs, claim_secs=args.claim_secs,
        lease_secs=args.lease_days * 86400.0, max_drives=args.max_drives)
    spaces_args = pairs(args.spaces_arg, "--spaces-arg")
    spaces = load_spaces(args.spaces, spaces_args)
    provider = json.dumps({"spaces": args.spaces, "args": spaces_args}, sort_keys=True)
    coordinator = Coordinator(store, spaces, config=config, id=args.id, host=args.host,
                              provider=provider)
    stop = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        stop.set()
        coordinator.wake.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    print(f"durable.coordinator: {coordinator.id} serving {store.url}", file=sys.stderr,
          flush=True)
    coordinator.serve(stop, until_idle=args.until_idle)
    return 0
