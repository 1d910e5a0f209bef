"""``chaos merge``: the shards of one campaign (``chaos run --shard I/N``) joined into the
results the whole campaign would have written: its run records (with their indices and
seeds), the failing runs' directories, the SUMMARY and the exit code.

Refused (``BadResults``, exit 254) when the directories are not the shards of one campaign:
a directory that is not a shard, shards of different campaigns (any setting but the shard,
the results root, ``--jobs``, ``--keep`` and ``--cluster`` differs), two shards with the
same number, or a shard missing (a SUMMARY of part of a campaign would pass for the whole of it).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any, TextIO

from chaos.campaign.campaign import CampaignConfig, publish
from chaos.campaign.records import ResultsDir
from chaos.errors import BadResults
from chaos.faults.plans import held_of
from chaos.modes.registry import MODES
from durable.session_log import DEFAULT_LOG_STORAGE

#: Settings that may differ between the shards of one campaign.
PER_SHARD = frozenset({"shard", "results_root", "jobs", "keep", "cluster"})


def merge(dirs: list[Path], results_root: Path, out: TextIO = sys.stdout) -> int:
    shards = [ResultsDir.open(d) for d in dirs]
    configs = [s.read_json("campaign.json") for s in shards]
    for shard, cfg in zip(shards, configs, strict=True):
        if not isinstance(cfg, dict) or not cfg.get("shard"):
            raise BadResults(f"{shard.path} is not a shard (its campaign ran without "
                             "--shard I/N); merge the results of `chaos run --shard`")
        number = cfg["shard"]
        if not (isinstance(number, list) and len(number) == 2 and
                all(isinstance(x, int) and not isinstance(x, bool) for x in number) and
                1 <= number[0] <= number[1]):
            raise BadResults(f"{shard.path}/campaign.json: shard {number!r} is not [I, N] "
                             "with 1 <= I <= N; the results directory is damaged")
    first = _common(configs[0])
    for shard, cfg in zip(shards[1:], configs[1:], strict=True):
        theirs = _common(cfg)
        differ = sorted(k for k in first.keys() | theirs.keys()
                        if first.get(k) != theirs.get(k))
        if differ:
            raise BadResults(f"{shard.path} is a shard of another campaign than "
                             f"{shards[0].path}: they differ in {', '.join(differ)}")
    _check_numbers(shards, configs)
    records: list[dict[str, Any]] = []
    seen: dict[int, Path] = {}
    for shard, cfg in zip(shards, configs, strict=True):
        runs = shard.runs()
        _check_whole(shard, cfg, runs)
        for record in runs:
            if record["index"] in seen:
                raise BadResults(f"run {record['index']} (seed {record['seed']}) is in both "
                                 f"{seen[record['index']]} and {shard.path}: overlapping "
                                 "shards")
            seen[record["index"]] = shard.path
            records.append(record)
    cfg = _config(configs[0])
    merged = ResultsDir.create(results_root, cfg.mode, cfg.backend)
    merged.write_json("campaign.json", {**configs[0], "shard": None,
                                        "results_root": str(results_root),
                                        "merged_from": [str(s.path) for s in shards]})
    for record in sorted(records, key=lambda r: r["index"]):
        if record.get("run_dir") and Path(record["run_dir"]).is_dir():
            kept = merged.runs_dir / Path(record["run_dir"]).name
            shutil.copytree(record["run_dir"], kept, symlinks=True)
            record["run_dir"] = str(kept)
        merged.append_run(record)
    # The shards ran side by side: the campaign took as long as its slowest shard.
    seconds = max((s.read_json("summary.json").get("seconds", 0.0) for s in shards
                   if (s.path / "summary.json").exists()), default=0.0)
    print(f"merge: {len(shards)} shards, {len(records)} runs", file=out)
    return publish(cfg, merged, records, seconds, out=out)


def _check_whole(shard: ResultsDir, cfg: dict[str, Any], runs: list[dict[str, Any]]) -> None:
    """The shard's records are the runs it says it ran: as many as its SUMMARY counted, each
    of its own share of the indices, each with the seed its index draws."""
    if not (shard.path / "summary.json").is_file():
        raise BadResults(f"{shard.path} has no summary.json: the shard did not finish; run "
                         "it again before merging")
    summary = shard.read_json("summary.json")
    if summary.get("verdict") == "interrupted":
        raise BadResults(f"{shard.path} was interrupted (Ctrl-C) before all its runs: run "
                         "the shard again before merging")
    counted = summary.get("runs")
    if counted != len(runs):
        raise BadResults(f"{shard.path}: runs.jsonl holds {len(runs)} run(s), its SUMMARY "
                         f"counted {counted}: a record is missing or extra; run the shard "
                         "again")
    i, n = cfg["shard"]
    seeds = cfg.get("seeds") or []
    for record in runs:
        if record["index"] % n != i - 1:
            raise BadResults(f"{shard.path}: run {record['index']} is not shard {i}/{n}'s "
                             f"(its runs are those whose index is {i - 1} modulo {n})")
        mode = MODES.get(str(cfg.get("mode")))
        if (mode is not None and mode.enumerates) or cfg.get("plans"):
            continue  # plans are listed, not drawn from a seed per index
        if seeds and record["index"] >= len(seeds):
            raise BadResults(f"{shard.path}: run {record['index']} is past the campaign's "
                             f"{len(seeds)} seeds: the record was changed")
        drawn = seeds[record["index"]] if seeds else cfg["seed_base"] + record["index"]
        if record["seed"] != drawn:
            raise BadResults(f"{shard.path}: run {record['index']} has seed {record['seed']}, "
                             f"but that run's seed is {drawn}: the record was changed")


def _common(cfg: dict[str, Any]) -> dict[str, Any]:
    """The settings every shard shares; of the code, its sources (a revision that differs
    only by commits that changed no source, or a README edit, is the same system)."""
    out = {k: v for k, v in cfg.items() if k not in PER_SHARD}
    if isinstance(out.get("code"), dict):
        out["code"] = out["code"].get("sources")
    return out


def _check_numbers(shards: list[ResultsDir], configs: list[dict[str, Any]]) -> None:
    by_number: dict[int, Path] = {}
    total = configs[0]["shard"][1]
    for shard, cfg in zip(shards, configs, strict=True):
        i, n = cfg["shard"]
        if n != total:
            raise BadResults(f"{shard.path} is shard {i}/{n}, {shards[0].path} one of "
                             f"{total}: shards of different splits")
        if i in by_number:
            raise BadResults(f"{by_number[i]} and {shard.path} are both shard {i}/{n}: "
                             "overlapping shards")
        by_number[i] = shard.path
    missing = sorted(set(range(1, total + 1)) - set(by_number))
    if missing:
        raise BadResults(f"shard(s) {', '.join(f'{i}/{total}' for i in missing)} missing: "
                         "merge every shard of the campaign")


def _config(raw: dict[str, Any]) -> CampaignConfig:
    """What ``publish`` reads of the campaign's settings."""
    return CampaignConfig(mode=raw["mode"], backend=raw["backend"], seed_base=raw["seed_base"],
                          seeds=tuple(raw.get("seeds") or ()), preset=raw.get("preset"),
                          durable_mode=raw.get("durable_mode"),
                          stale_kind=raw.get("stale_kind", "race"),
                          log_storage=raw.get("log_storage") or DEFAULT_LOG_STORAGE,
                          held=held_of(raw))
