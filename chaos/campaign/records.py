"""The results directory of a campaign, written in phases with atomic writes.

Layout of ``results/<mode>-<backend>-<timestamp>/``:

- ``campaign.json``: the configuration (phase 1, before any run);
- ``runs.jsonl``: one JSON line per finished run (phase 2, appended and fsynced as runs end);
- ``runs/run-NNNN/``: kept only for runs that did not pass: the log (``state/log.sqlite``),
  the workspace tarball, the driver logs, and ``plan.json``;
- ``summary.json`` and ``SUMMARY`` (phase 3, after the verdicts), plus plots.

``results/latest`` points at the newest campaign. Results are for humans and ``repro``;
nothing reads them for correctness (Hypothesis's "a cache you never need to invalidate").
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path, PurePosixPath
from typing import Any

from chaos.errors import BadResults
from chaos.modes.registry import MODES
from durable.atomic_file import write_atomic

#: Fields every run record has; a line without them is not a run record.
RECORD_FIELDS = ("index", "seed", "verdict", "plan")


def _unsound(record: dict[str, Any]) -> str | None:
    """What is wrong with a run record's fields, or None (a record is input: a repro, a
    merge and the reports act on it)."""
    from chaos.faults.plans import FaultPlan

    if isinstance(record["index"], bool) or not isinstance(record["index"], int) or \
            record["index"] < 0:
        return f"index {record['index']!r} is not a run index"
    if isinstance(record["seed"], bool) or not isinstance(record["seed"], int):
        return f"seed {record['seed']!r} is not a whole number"
    mode = MODES.get(str(record.get("campaign_mode")))
    agentless = mode is not None and not mode.has_agent  # 0 steps, no observation
    steps = record.get("steps")
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or
                              steps < (0 if agentless else 1)):
        return f"steps {steps!r} is not a positive whole number"
    verdict = record["verdict"]
    if not isinstance(verdict, dict) or verdict.get("valid") not in (True, False, "unknown"):
        return f"verdict {verdict!r} is not a verdict"
    if record.get("observation") is None and verdict["valid"] is True and not agentless:
        return "a run judged valid without an observation"
    try:
        FaultPlan.from_json(record["plan"])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        return f"plan is not a fault plan ({type(exc).__name__}: {exc})"
    return None


class ResultsDir:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.runs_dir = path / "runs"
        self._lock = threading.Lock()

    @classmethod
    def create(cls, root: Path, mode: str, backend: str) -> ResultsDir:
        if root.exists() and not root.is_dir():
            raise NotADirectoryError(f"--results {root} is a file, not a directory; pass the "
                                     "directory campaigns are written under")
        root.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%dT%H%M%S")
        path = root / f"{mode}-{backend}-{stamp}"
        n = 1
        while path.exists():
            n += 1
            path = root / f"{mode}-{backend}-{stamp}-{n}"
        path.mkdir()
        (path / "runs").mkdir()
        link = root / "latest"
        tmp = root / f".latest-{os.getpid()}"
        if tmp.is_symlink() or tmp.exists():
            tmp.unlink()
        tmp.symlink_to(path.name)
        os.replace(tmp, link)
        return cls(path)

    @classmethod
    def open(cls, path: Path) -> ResultsDir:
        path = Path(path)
        if not (path / "campaign.json").exists():
            raise FileNotFoundError(
                f"{path} is not a campaign results directory (no campaign.json); pass "
                "results/<campaign> or results/latest")
        return cls(path.resolve())

    def write_json(self, name: str, obj: Any) -> None:
        write_atomic(self.path / name, json.dumps(obj, indent=2, sort_keys=True) + "\n")

    def read_json(self, name: str) -> Any:
        try:
            return json.loads((self.path / name).read_text())
        except (ValueError, UnicodeDecodeError) as exc:
            raise BadResults(f"{self.path / name} is not readable JSON ({exc}); the results "
                             "directory is damaged: re-run the campaign") from None

    def append_run(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, sort_keys=True) + "\n"
        with self._lock, open(self.path / "runs.jsonl", "a") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        if record.get("run_dir"):
            write_atomic(Path(record["run_dir"]) / "plan.json",
                         json.dumps(record["plan"], indent=2) + "\n")

    def _run_dir(self, run_dir: Any, where: str) -> Path:
        """``runs/<name>`` here for a record's ``run_dir`` (written as an absolute path under
        the campaign's ``runs/``); anything else (a path elsewhere, ``..``, a symlink out) is
        refused: a results directory is input, and merge copies what it names."""
        named = PurePosixPath(run_dir) if isinstance(run_dir, str) else None
        if named is None or named.parent.name != "runs" or named.name in ("", ".", ".."):
            raise BadResults(f"{where}: run_dir {run_dir!r} is not a run directory of the "
                             f"campaign (…/runs/<run>); refusing to read anything outside "
                             f"{self.path}: re-run the campaign")
        mine = self.runs_dir / named.name
        if mine.is_symlink():
            raise BadResults(f"{where}: {mine} is a symlink; a run's directory is a directory "
                             f"in {self.runs_dir}: re-run the campaign")
        return mine

    def runs(self) -> list[dict[str, Any]]:
        """The run records, by index. A torn last line (a campaign killed while writing it)
        is skipped; anything else unreadable raises ``BadResults``, naming the line. A
        record's ``run_dir`` is read as the run's directory in this results directory
        (``runs/<name>``, wherever the directory was moved or copied to), never as a path
        elsewhere."""
        path = self.path / "runs.jsonl"
        if not path.exists():
            return []
        if not path.is_file():  # a FIFO would block the read
            raise BadResults(f"{path} is not a regular file; the results directory is "
                             "damaged: re-run the campaign")
        try:
            lines = path.read_text().splitlines()
        except UnicodeDecodeError as exc:
            raise BadResults(f"{path} is not UTF-8 text ({exc}); the results directory is "
                             "damaged: re-run the campaign") from None
        by_index: dict[int, dict[str, Any]] = {}
        for i, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                if i == len(lines):
                    break  # a torn last line from a campaign that was killed
                raise BadResults(f"{path}, line {i}: not a JSON record ({exc}); the results "
                                 "directory is damaged: re-run the campaign") from None
            if not isinstance(record, dict) or not all(k in record for k in RECORD_FIELDS):
                raise BadResults(f"{path}, line {i}: not a run record (a run record has "
                                 f"{', '.join(RECORD_FIELDS)}); re-run the campaign")
            why = _unsound(record)
            if why:
                raise BadResults(f"{path}, line {i}: {why}; the results directory is damaged: "
                                 "re-run the campaign")
            if record["index"] in by_index:
                raise BadResults(f"{path}, line {i}: a second record of run "
                                 f"{record['index']}; one campaign records each run once")
            if record.get("run_dir") is not None:
                record["run_dir"] = str(self._run_dir(record["run_dir"], f"{path}, line {i}"))
            by_index[record["index"]] = record
        return [by_index[i] for i in sorted(by_index)]
