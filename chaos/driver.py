"""The campaign's driver program: ``python -m chaos.driver``.

It composes what ``durable`` must not import: a scenario's scripted model, a backend and the
adapter, and hands them to ``durable.session_driver.run_durable_session``. The runner
launches it once per attempt with ``CUA_SESSION_*`` in the environment (and
``CUA_FAILPOINTS`` when it wants to stop it at a failpoint) and reads its exit code.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from backends.space_client import REQUEST_TIMEOUT_S
from chaos.campaign.live import die_with_parent
from chaos.faults.link_proxy import LinkTable
from chaos.run.forked_run import ForkedRun
from chaos.space_providers import backend, make_spaces, snapshot_kind
from durable.adapter import (
    DirectoryCheckpointStore,
    DurableSpaces,
    SnapshotProvider,
    TransactionalLimits,
    WorkspaceSnapshots,
    durable_spaces,
)
from durable.coding_tools import coding_tools
from durable.fence_contract import Fence
from durable.harness import Submission
from durable.session_driver import Session, SessionEnv, run_durable_session
from durable.tools import ToolRegistry
from scenarios import scenario_of
from scenarios.host_tools import effect_tools
from scenarios.plan import Scenario

if TYPE_CHECKING:
    from durable.virtual import Tree

REQUEST_ID = "campaign-input"
SPACE_PREFIX = "cua"
#: The failpoint channel for the daemons this driver brings up (a Space it rebuilds), set
#: by the runner beside the driver's own ``CUA_FAILPOINTS``.
SPACE_FAILPOINTS_ENV = "CHAOS_SPACE_FAILPOINTS"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m chaos.driver", description=__doc__)
    p.add_argument("--run-dir", type=Path, required=True)
    p.add_argument("--preset", default="default",
                   help="a preset's name or path, or workload:<path> (a workload file)")
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--keep-steps", default=None,
                   help="only these steps (comma-separated indices): a shrunk scenario")
    p.add_argument("--simple-steps", default="",
                   help="these steps (comma-separated indices) replaced by a simple write: "
                        "a shrunk scenario")
    p.add_argument("--mode", choices=("auto", "transactional", "checkpoint"), required=True)
    p.add_argument("--backend", default="local")
    p.add_argument("--spaces-dir", type=Path, default=None,
                   help="the run directory whose Spaces provider to use (default: --run-dir); "
                        "a second session of a run shares its provider this way")
    p.add_argument("--snapshots", choices=("auto", "workspace", "machine"), default="auto",
                   help="checkpoints as workspace snapshots or whole-machine ones (microvm); "
                        "auto: machine on microvm, else workspace")
    p.add_argument("--request-timeout", type=float, default=REQUEST_TIMEOUT_S,
                   help="seconds a request to a Space waits for its answer before its "
                        "outcome is unknown")
    p.add_argument("--links", type=Path, default=None,
                   help="reach the Spaces through the run's link proxies listed here "
                        "(chaos.faults.link_proxy.LinkTable)")
    p.add_argument("--no-store", action="store_true",
                   help="checkpoint mode without a CheckpointStore (lost Spaces are fatal)")
    return p.parse_args(argv)


def _indices(text: str) -> tuple[int, ...]:
    return tuple(int(i) for i in text.split(",") if i)


def main(argv: list[str] | None = None) -> int:
    die_with_parent()
    args = parse_args(sys.argv[1:] if argv is None else argv)
    keep = None if args.keep_steps is None else _indices(args.keep_steps)
    scenario = scenario_of(args.preset, args.seed, steps=args.steps, keep=keep,
                           simple=_indices(args.simple_steps))
    preset = scenario.preset
    if not backend(args.backend).spaces:
        return _virtual_session(args, scenario)
    spaces = make_spaces(args.backend, args.spaces_dir or args.run_dir,
                         failpoints=os.environ.get(SPACE_FAILPOINTS_ENV) or None,
                         request_timeout=args.request_timeout,
                         via=LinkTable(args.links).route if args.links else None)
    store = None if args.no_store else DirectoryCheckpointStore(args.run_dir / "store")
    if snapshot_kind(args.backend, args.snapshots) == "machine":
        from backends.microvm import MicroVMSpaces, SandboxSnapshots

        assert isinstance(spaces, MicroVMSpaces)
        snapshots: SnapshotProvider = SandboxSnapshots(spaces)
    else:
        snapshots = WorkspaceSnapshots(spaces, "", store)

    def build(fence: Fence, senv: SessionEnv) -> DurableSpaces:
        return durable_spaces(
            session=senv.name, spaces=spaces, snapshots=snapshots,
            mode=args.mode, fence=fence, epoch=senv.epoch, space_prefix=SPACE_PREFIX,
            root_space=senv.space,
            transactional=TransactionalLimits(max_files=preset.max_files,
                                              max_bytes=preset.max_bytes))

    def start(session: Session) -> Submission | ForkedRun:
        return _play(session, scenario,
                     ToolRegistry(coding_tools() + effect_tools(args.run_dir / "effects")))

    return run_durable_session(durable=build, start=start)


def _play(session: Session, scenario: Scenario, registry: ToolRegistry
          ) -> Submission | ForkedRun:
    """The scripted agent's input, admitted once; a forking agent goes on in its fork."""
    harness = session.open_harness(models=scenario.model(), registry=registry)
    root = harness.root("scripted").submit(content=f"play scenario {scenario.seed}",
                                           request_id=REQUEST_ID)
    if scenario.fork_after is None:
        return root
    return ForkedRun(session, root, scenario.fork_after)


def initial_tree(scenario: Scenario) -> Tree:
    """The scenario's initial workspace as a virtual workspace's files."""
    from durable.virtual import Node
    tree: Tree = {p: Node("file", mode, data) for p, (data, mode) in scenario.initial.files.items()}
    tree.update({p: Node("symlink", 0, t.encode()) for p, t in scenario.initial.links.items()})
    return tree


def _virtual_session(args: argparse.Namespace, scenario: Scenario) -> int:
    """The session on a virtual workspace: its files in the log, no Space at all."""
    from durable.virtual import virtual
    workspace = virtual(initial=initial_tree(scenario))

    def start(session: Session) -> Submission | ForkedRun:
        return _play(session, scenario, ToolRegistry(effect_tools(args.run_dir / "effects")))

    return run_durable_session(durable=lambda _fence, _senv: workspace, start=start)


if __name__ == "__main__":
    sys.exit(main())
