"""``chaos run``'s flags and ``CRASH_*`` variables, checked at the boundary.

Everything a campaign cannot run is refused here, before anything runs, with one line
saying what to pass (``BadArguments``; the CLI exits 254): a mode or backend that does not
exist (also when it came from the environment, where argparse does not look), a driver
program that cannot be found, counts out of range, an unknown failpoint, a bad preset.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
from pathlib import Path

from chaos.campaign.campaign import CampaignConfig
from chaos.cluster.dask_pool import check_address
from chaos.errors import BadArguments
from chaos.faults.plans import ALL_POINTS, HELD_KINDS, HeldAction, held_of
from chaos.modes.registry import MODES
from chaos.modes.stale_kinds import KINDS
from chaos.space_providers import BACKEND_DESCRIPTORS, BACKENDS, backend, snapshot_kind
from durable.session_log import LOG_NAMES
from scenarios import load, scenario_of, workload
from scenarios.preset import MAX_STEPS, VIRTUAL_SHELL_LACKS

#: The most runs one campaign takes (more is a typo, or a job for ``--shard``/a cluster).
MAX_RUNS = 1_000_000
DURABLE_MODES = ("auto", "transactional", "checkpoint")
#: The campaign modes whose drawn plans may hold a fault on a Space (``plans.HELD_KINDS``:
#: ``--pause-spaces``, ``--cut-links``, ``--jump-clocks``...).
HELD_MODES = tuple(name for name, mode in MODES.items() if mode.holds)
#: The campaign modes that run on a virtual workspace.
VIRTUAL_MODES = tuple(name for name, mode in MODES.items() if mode.virtual)


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return None
    if not re.fullmatch(r"-?[0-9]+", raw.strip()):
        raise BadArguments(f"Expected an integer in {name} but got {name}={raw!r}")
    return int(raw)


def _env_choice(flag: str, value: str | None, env: str, choices: tuple[str, ...]) -> None:
    """argparse checks the choices of a flag given, not of a default taken from ``env``."""
    if value is not None and value not in choices:
        raise BadArguments(f"{env}={value!r} (the default of {flag}) is not one of "
                           f"{', '.join(choices)}")


def _check_driver(driver: str) -> None:
    if driver.endswith(".py"):
        if not Path(driver).is_file():
            raise BadArguments(f"--driver {driver}: no such file; pass a driver program's "
                               ".py path or a module name (default chaos.driver)")
        return
    try:
        found = importlib.util.find_spec(driver)
    except (ImportError, ValueError):
        found = None
    if found is None:
        raise BadArguments(f"--driver {driver}: no such module; pass a module name (run with "
                           "-m, default chaos.driver) or a driver program's .py path")


def parse_shard(text: str | None) -> tuple[int, int] | None:
    """``I/N`` (1 <= I <= N) as ``(I, N)``; None for None."""
    if text is None:
        return None
    i, _, n = text.partition("/")
    try:
        shard = int(i), int(n)
    except ValueError:
        shard = (0, 0)
    if not 1 <= shard[0] <= shard[1] <= MAX_RUNS:
        raise BadArguments(f"--shard {text!r} is not I/N with 1 <= I <= N (e.g. 2/3: the "
                           "second of three shards)")
    return shard


def _snapshots(args: argparse.Namespace) -> str:
    _env_choice("--snapshots", args.snapshots, "CRASH_SNAPSHOTS", ("auto", "workspace",
                                                                  "machine"))
    if args.snapshots == "machine" and not backend(args.backend).machines:
        raise BadArguments(f"--snapshots machine needs --backend microvm (whole-machine "
                           f"checkpoints), not {args.backend}")
    return str(args.snapshots)


def _log_storage(args: argparse.Namespace) -> str:
    _env_choice("--log", args.log_storage, "CRASH_LOG", tuple(LOG_NAMES))
    return str(args.log_storage)


def _held(args: argparse.Namespace) -> tuple[HeldAction, ...]:
    """The held kinds whose flags (``--pause-spaces``...) are on, where they can be."""
    held = held_of(vars(args))
    for kind in (HELD_KINDS[a] for a in held):
        if not MODES[args.mode].holds or not backend(args.backend).spaces:
            raise BadArguments(f"{kind.flag} holds a fault on a Space in --mode "
                               f"{', '.join(HELD_MODES)} on a backend with Spaces, not --mode "
                               f"{args.mode} --backend {args.backend}")
        if kind.needs is not None and not kind.needs(backend(args.backend)):
            able = [name for name, b in BACKEND_DESCRIPTORS.items() if kind.needs(b)]
            raise BadArguments(f"{kind.flag} needs --backend {' or '.join(able)}, "
                               f"not {args.backend}: {kind.needs_why}")
        if kind.modes and args.mode not in kind.modes:
            raise BadArguments(f"{kind.flag} is for --mode {', '.join(kind.modes)}, not "
                               f"{args.mode}")
        if args.mode == "stale" and (why := kind.stale_refusal(args.stale_kind)):
            raise BadArguments(why)
        durable = args.durable_mode or MODES[args.mode].durable
        if kind.in_machine and backend(args.backend).machines and \
                durable != "transactional" and \
                snapshot_kind(args.backend, args.snapshots) == "machine":
            raise BadArguments(f"{kind.flag} {kind.in_machine}, and a whole-machine checkpoint "
                               "taken while it holds would bring it back after its end, with "
                               "nothing left to undo it: add --snapshots workspace (or run the "
                               "adapter transactional, which takes no checkpoints)")
        if kind.root and os.geteuid() != 0:
            raise BadArguments(f"{kind.flag} needs root ({kind.needs_why}); run the "
                               "campaign as root, or leave it out")
    disks = [HELD_KINDS[a] for a in held if HELD_KINDS[a].log_disk]
    if len(disks) > 1:
        raise BadArguments(f"{' and '.join(k.flag for k in disks)} each put the log on a disk "
                           "of their own (a tmpfs to fill, an ext4 image to cut the power "
                           "under): give one of them per campaign")
    return held


def _store(args: argparse.Namespace) -> str | None:
    if args.store is None:
        return None
    if not MODES[args.mode].coordinated:
        raise BadArguments(f"--store is for --mode "
                           f"{', '.join(n for n, m in MODES.items() if m.coordinated)} (the "
                           f"coordinator's store), not {args.mode}")
    if not args.store.startswith(("postgresql://", "postgres://")):
        raise BadArguments(f"--store {args.store!r}: pass a PostgreSQL server "
                           "(postgresql://user:password@host:port/db); without --store each "
                           "run keeps a SQLite store of its own")
    if args.coordinators is not None and not 1 <= args.coordinators <= 8:
        raise BadArguments(f"--coordinators is from 1 to 8, got {args.coordinators}")
    return str(args.store)


def campaign_config(args: argparse.Namespace) -> CampaignConfig:
    """The campaign ``chaos run`` asks for; ``BadArguments`` when it cannot run."""
    if args.mode is None:
        raise BadArguments("no campaign mode: pass --mode or set CRASH_MODE "
                           f"(one of {', '.join(MODES)})")
    if args.mode not in MODES:
        raise BadArguments(f"CRASH_MODE={args.mode!r} is not a mode; use one of "
                           f"{', '.join(MODES)}")
    _env_choice("--backend", args.backend, "CRASH_BACKEND", BACKENDS)
    _env_choice("--durable-mode", args.durable_mode, "CRASH_DURABLE_MODE", DURABLE_MODES)
    _env_choice("--stale-kind", args.stale_kind, "CRASH_STALE_KIND", KINDS)
    mode = MODES[args.mode]
    if mode.backend is not None and args.backend != mode.backend:
        raise BadArguments(f"--mode {args.mode} {mode.backend_why}: it needs "
                           f"--backend {mode.backend}, not {args.backend}")
    if not backend(args.backend).spaces and (not mode.virtual or
                                    args.durable_mode not in (None, "transactional")):
        raise BadArguments(f"--backend virtual keeps the workspace in the log with each call's "
                           f"result: run --mode {' or '.join(VIRTUAL_MODES)} (durable mode "
                           f"transactional), not --mode {args.mode}"
                           + (f" --durable-mode {args.durable_mode}" if args.durable_mode
                              else ""))
    _check_driver(args.driver)
    if args.results.exists() and not args.results.is_dir():
        raise BadArguments(f"--results {args.results} is a file, not a directory; pass the "
                           "directory campaigns are written under")
    if not args.results.exists() and not args.results.parent.is_dir():
        raise BadArguments(f"--results {args.results}: its parent {args.results.parent} does "
                           "not exist (a typo?); create it, or pass a directory in one that "
                           "does")
    runs = args.runs if args.runs is not None else _env_int("CRASH_RUNS")
    steps = args.steps if args.steps is not None else _env_int("CRASH_STEPS")
    seed = args.seed_base if args.seed_base is not None else _env_int("CRASH_SEED_BASE")
    if runs is not None and not 1 <= runs <= MAX_RUNS:
        raise BadArguments(f"--runs must be from 1 to {MAX_RUNS}, got {runs}")
    if steps is not None and not 1 <= steps <= MAX_STEPS:
        raise BadArguments(f"--steps must be from 1 to {MAX_STEPS}, got {steps}")
    if args.jobs < 1:
        raise BadArguments(f"--jobs must be at least 1, got {args.jobs}")
    preset = args.preset
    if args.workload is not None:
        if preset is not None:
            raise BadArguments("--workload and --preset both name the agent; pass one")
        preset = workload.PREFIX + str(workload.find(args.workload).resolve())
    cfg = CampaignConfig(mode=args.mode, backend=args.backend, runs=runs, steps=steps,
                         seed_base=1 if seed is None else seed, jobs=args.jobs,
                         preset=preset, durable_mode=args.durable_mode,
                         results_root=args.results, keep=args.keep, driver=args.driver,
                         points=tuple(p for p in args.points.split(",") if p),
                         pairs=args.pairs, stop_on_failure=args.stop_on_failure,
                         stale_kind=args.stale_kind, shard=parse_shard(args.shard),
                         redrive_kind=args.redrive_kind, store=_store(args),
                         snapshots=_snapshots(args),
                         coordinators=args.coordinators,
                         log_storage=_log_storage(args),
                         held=_held(args),
                         cluster=None if args.cluster is None else check_address(args.cluster))
    unknown = sorted(set(cfg.points) - set(ALL_POINTS))
    if unknown:
        raise BadArguments(f"unknown failpoint(s) {unknown}; known: {sorted(ALL_POINTS)}")
    if cfg.preset_name.startswith(workload.PREFIX) or cfg.preset_name == workload.REAL:
        scenario_of(cfg.preset_name, cfg.seed_base)  # a bad workload: before anything runs
    else:
        preset = load(cfg.preset_name)  # a bad preset is a bad argument, before anything runs
        lacking = sorted(preset.kinds & set(VIRTUAL_SHELL_LACKS))
        if not backend(cfg.backend).spaces and lacking:
            raise BadArguments(
                f"--preset {cfg.preset_name} draws step kinds a virtual workspace's shell does "
                "not run as bash does (" + "; ".join(f"{k}: {VIRTUAL_SHELL_LACKS[k]}"
                                                      for k in lacking)
                + "), so its runs would fail for the shell, not for a crash; use --preset "
                "virtual (or virtual-small), or a preset without those kinds, or a backend "
                "with Spaces")
    return cfg
