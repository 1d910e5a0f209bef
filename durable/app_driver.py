"""``python -m durable run MODULE:START``: the session driver for any app's ``start``.

An app gives one function, ``start(session) -> Submission``: it opens the harness with its
models and tools (``session.open_harness``) and submits the session's input
(``session.env.input``) with a fixed request id, so that every attempt resumes the same
request. This module is the rest of a driver: it reads the session from the environment a
coordinator sets (``durable.session_driver``), makes the Spaces provider the coordinator
names (``CUA_SPACE_PROVIDER``, or ``--spaces``), builds the Space adapter in the session's
mode (``CUA_SESSION_MODE``, or ``--mode``; auto by default) with a checkpoint store in the
session's state directory where the mode takes checkpoints (unless
``CUA_SESSION_CHECKPOINT_STORE=0`` or ``--no-checkpoint-store``), and
runs one attempt. A coordinator launches it as the session's command:

    python -m durable.coordinator submit s1 --space ws1 --state-dir /var/lib/s1 \\
        --input "fix the build" -- python -m durable run myapp.agent:start

Exit codes are the driver's (0 finished, 75 fenced, 78 permanent, else crashed); a
``MODULE:START`` that cannot be loaded, or a provider that cannot be made, is permanent
(78) and says what to pass.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from .adapter import DirectoryCheckpointStore, DurableSpaces, WorkspaceSnapshots, durable_spaces
from .coordinator.records import MODES
from .fence_contract import Fence
from .harness import Submission
from .session_driver import EXIT_PERMANENT, Session, SessionEnv, exit_line, run_durable_session
from .spaces import Spaces
from .spaces_loader import BadProvider, load_spaces, pairs

PROVIDER_ENV = "CUA_SPACE_PROVIDER"
MODE_ENV = "CUA_SESSION_MODE"
STORE_ENV = "CUA_SESSION_CHECKPOINT_STORE"
#: Where the checkpoint store lives, under the session's state directory.
STORE_DIR = "checkpoints"

Start = Callable[[Session], Submission]


class BadApp(ValueError):
    """The app or the driver's options cannot be used; the message says what to pass."""


class _Parser(argparse.ArgumentParser):
    """Bad options are a permanent failure (78), never argparse's exit 2, which a
    coordinator would take for a crash and retry."""

    def error(self, message: str) -> NoReturn:
        raise BadApp(f"{message} (python -m durable run --help)")


def parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="python -m durable run", description="The session driver for an app's start "
        "function: run one attempt of the session the environment names (a coordinator "
        "sets it; see durable.session_driver).")
    p.add_argument("start", metavar="MODULE:START",
                   help="the app's start(session) -> Submission, e.g. myapp.agent:start")
    p.add_argument("--spaces", metavar="MODULE:FACTORY", default=None,
                   help=f"the Spaces provider (default: the one ${PROVIDER_ENV} names, as a "
                        "coordinator sets it)")
    p.add_argument("--spaces-arg", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--mode", choices=MODES, default=None,
                   help=f"the adapter's mode (default: ${MODE_ENV}, else auto)")
    p.add_argument("--no-checkpoint-store", action="store_true",
                   help="keep checkpoints only inside the Space (a lost Space then ends a "
                        f"checkpoint-mode session); default: ${STORE_ENV}, else a store in "
                        f"the state directory's {STORE_DIR}/")
    return p


def load_start(target: str) -> Start:
    """The app's ``start`` named ``MODULE:START``."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise BadApp(f"{target!r}: expected MODULE:START, e.g. myapp.agent:start")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise BadApp(f"cannot load {target}: {type(exc).__name__}: {exc}; is the app's "
                     "package on PYTHONPATH?") from None
    except Exception as exc:  # noqa: BLE001 - the app's module failed as it loaded: its bug
        raise BadApp(f"importing {module_name} failed: {type(exc).__name__}: {exc}; fix "
                     "the app's module (every attempt would fail the same way)") from None
    if not callable(fn):
        raise BadApp(f"{target} is a {type(fn).__name__}, not a function start(session)")
    return fn  # type: ignore[no-any-return]  # a user's callable: its type is its promise


def provider(args: argparse.Namespace, environ: dict[str, str]) -> Spaces:
    """The Spaces provider of ``--spaces``, else of ``CUA_SPACE_PROVIDER`` (the JSON the
    coordinator writes: ``{"spaces": "MODULE:FACTORY", "args": {...}}``)."""
    if args.spaces is not None:
        return load_spaces(args.spaces, pairs(args.spaces_arg, "--spaces-arg"))
    raw = environ.get(PROVIDER_ENV)
    if not raw:
        raise BadApp(f"no Spaces provider: pass --spaces MODULE:FACTORY (e.g. "
                     f"backends.local:LocalSpaces --spaces-arg base_dir=DIR), or run under a "
                     f"coordinator, which sets ${PROVIDER_ENV}")
    try:
        spec: Any = json.loads(raw)
        target, spaces_args = spec["spaces"], spec.get("args", {})
        if not isinstance(target, str) or not isinstance(spaces_args, dict):
            raise TypeError("spaces must be a string and args an object")
    except (ValueError, KeyError, TypeError) as exc:
        raise BadApp(f"${PROVIDER_ENV} is not a provider's description ({exc}): expected "
                     '{"spaces": "MODULE:FACTORY", "args": {...}}') from None
    return load_spaces(target, {str(k): str(v) for k, v in spaces_args.items()})


def main(argv: Sequence[str], environ: dict[str, str] | None = None) -> int:
    env = dict(os.environ if environ is None else environ)
    try:
        args = parser().parse_args(list(argv))
        start = load_start(args.start)
        spaces = provider(args, env)
        mode = args.mode or env.get(MODE_ENV) or "auto"
        if mode not in MODES:
            raise BadApp(f"${MODE_ENV}={mode!r}: expected one of {', '.join(MODES)}")
    except (BadApp, BadProvider) as exc:
        return exit_line(EXIT_PERMANENT, f"bad driver options: {exc}")
    # transactional mode keeps the workspace's image in the log: no checkpoints at all
    keep_store = (mode != "transactional" and not args.no_checkpoint_store
                  and env.get(STORE_ENV, "1") != "0")

    def build(fence: Fence, senv: SessionEnv) -> DurableSpaces:
        store = (DirectoryCheckpointStore(Path(senv.state_dir) / STORE_DIR) if keep_store
                 else None)
        return durable_spaces(session=senv.name, spaces=spaces,
                              snapshots=WorkspaceSnapshots(spaces, "", store), mode=mode,
                              fence=fence, epoch=senv.epoch, root_space=senv.space)

    return run_durable_session(durable=build, start=start, environ=env)
