"""``chaos shrink``: a failing run cut down to the smallest plan that still fails the same
check, printed as a story a person can read (Hypothesis's minimal falsifying example, for
crash plans).

The search starts from the failing run's scenario and fault plan. Every candidate is a real
run with real kills; it *fails the same check* when its verdict is a failure that names the
original's check (G1 state, G2 never twice, ...: a different failure is another bug). The
passes, repeated until none makes progress:

1. fewer faults: delta debugging (Zeller's ddmin) over the plan's faults, the candidates of
   one round run in parallel (``--jobs``);
2. fewer steps: the shortest prefix of the steps that still fails (a scenario of *k* steps
   is the prefix of a longer one of the same seed), else ddmin over the steps: a step
   dropped keeps the others as they were (same index, arguments and marker), and the
   checks predict every result from the workspace the step meets;
3. simpler steps: each step that is not a write already replaced, one at a time, by the
   simplest step there is (a write of its marker to a file of its own,
   ``scenarios.steps.simple_step``) while the run still fails;
4. earlier failpoint occurrences: each failpoint fault's occurrence lowered as far as it
   still fails.

Steps dropped or simplified move where a failpoint fault lands (the steps before it hit
that failpoint fewer times), so each such candidate is also tried with its one failpoint
fault moved to every earlier occurrence.

A candidate whose plan has a fault due after a delay depends on timing: it runs ``tries``
times and counts only if it fails every time (the output says how many candidates were
rejected as flaky). Results are cached by candidate. The shrunk plan is then replayed
``confirm`` times; ``shrunk.json`` (the scenario's seed, preset, steps and the steps kept,
the steps simplified, the plan, the check and how many replays failed) is written next to
the run, and ``chaos
repro --plan`` replays it.
"""

from __future__ import annotations

import itertools
import json
import shutil
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TextIO

from chaos.campaign import code_identity, live
from chaos.campaign.progress import Progress, faults_fired
from chaos.errors import BadArguments
from chaos.faults.plans import Fault, FaultPlan, held_flags, held_of
from chaos.run.record import RunRecord
from chaos.run.runner import Run
from chaos.run.spec import RunSpec
from durable.atomic_file import write_atomic
from durable.session_log import DEFAULT_LOG_STORAGE
from scenarios import scenario_of
from scenarios.steps import SIMPLE_KIND

#: Checks that say the run proved nothing about the system: never a shrink target.
NOT_CHECKS = ("nemesis", "untested")
SHRUNK_NAME = "shrunk.json"


@dataclass(frozen=True)
class Candidate:
    faults: tuple[Fault, ...]
    #: The indices of the scenario's steps the agent takes (at least one).
    keep: tuple[int, ...]
    #: Those of the kept steps replaced by the simplest step (``simple_step``).
    simple: tuple[int, ...] = ()

    @classmethod
    def whole(cls, faults: tuple[Fault, ...], steps: int) -> Candidate:
        return cls(faults, tuple(range(steps)))

    @property
    def steps(self) -> int:
        """Steps of the scenario drawn (its kept steps are among them)."""
        return self.keep[-1] + 1

    def kept(self, keep: tuple[int, ...]) -> Candidate:
        """This candidate with only the steps ``keep`` (the simplified among them stay so)."""
        return Candidate(self.faults, keep, tuple(i for i in self.simple if i in keep))

    def simplified(self, index: int) -> Candidate:
        return replace(self, simple=tuple(sorted((*self.simple, index))))

    def size(self) -> tuple[int, int, int, int]:
        """Smaller is simpler: fewer faults, fewer steps, fewer steps left as they were
        drawn (not simplified), earlier occurrences."""
        return (len(self.faults), len(self.keep), len(self.keep) - len(self.simple),
                sum(f.occurrence or 0 for f in self.faults))

    def timed(self) -> bool:
        return any(f.trigger == "time" for f in self.faults)


@dataclass
class Shrinker:
    """The search's state: the failing run's spec, the check, the cache of candidates."""

    base: RunSpec
    check: str
    jobs: int = 2
    tries: int = 3
    #: The note of what the candidates' runs own (``live``): a killed shrink leaves nothing
    #: ``chaos clean`` cannot end.
    note: live.Campaign | None = None
    #: Where each candidate run is counted (``chaos.campaign.progress``); None: nowhere.
    progress: Progress | None = None
    #: Candidate runs so far, and timed candidates that failed some tries but not all.
    runs: int = 0
    flaky: int = 0

    def __post_init__(self) -> None:
        self._cache: dict[Candidate, RunRecord | None] = {}
        self._numbers = itertools.count(1)
        self._lock = threading.Lock()
        self.kinds = {s.index: s.kind for s in scenario_of(self.base.preset, self.base.seed,
                                                           steps=self.base.steps).steps}

    def spec(self, c: Candidate, work: Path) -> RunSpec:
        assert self.base.plan is not None
        return replace(self.base, plan=replace(self.base.plan, faults=c.faults),
                       steps=c.steps, work_dir=work, keep=False,
                       keep_steps=None if len(c.keep) == c.steps else c.keep,
                       simple_steps=c.simple)

    def run_once(self, c: Candidate) -> RunRecord:
        number = next(self._numbers)
        work = self.base.work_dir / f"candidate-{number:04d}"
        with self._lock:
            self.runs += 1
        try:
            record = Run(self.spec(c, work), self.note).execute()
        finally:
            shutil.rmtree(work, ignore_errors=True)
        if self.progress is not None:
            fails = self.fails(record)
            self.progress.advance(
                f"candidate {number} faults={len(c.faults)} steps={len(c.keep)} "
                f"simplified={len(c.simple)} {'fails' if fails else 'does not fail'} "
                f"{self.check} kills={record.counts['kills']} {record.seconds:.1f}s",
                failed=fails, unknown=record.verdict.valid == "unknown",
                faults=faults_fired(record.counts))
        return record

    def fails(self, record: RunRecord) -> bool:
        return record.verdict.valid is False and self.check in record.verdict.checks

    def _judge(self, c: Candidate) -> RunRecord | None:
        """A failing record of ``c`` when it fails the check every time it runs, else None."""
        failing = None
        for attempt in range(self.tries if c.timed() else 1):
            record = self.run_once(c)
            if not self.fails(record):
                if attempt > 0:  # failed before, passed now: timing decides, rejected
                    with self._lock:
                        self.flaky += 1
                return None
            failing = record
        return failing

    def first_failing(self, candidates: list[Candidate]) -> tuple[Candidate, RunRecord] | None:
        """The first of ``candidates`` (in their order) that fails the check; they run in
        parallel, ``jobs`` at once, in batches."""
        todo = [c for c in dict.fromkeys(candidates) if c not in self._cache]
        for i in range(0, len(todo), max(1, self.jobs)):
            batch = todo[i:i + max(1, self.jobs)]
            with ThreadPoolExecutor(max_workers=max(1, self.jobs)) as pool:
                for c, record in zip(batch, pool.map(self._judge, batch), strict=True):
                    self._cache[c] = record
            found = next((c for c in candidates if self._cache.get(c)), None)
            if found is not None:
                record = self._cache[found]
                assert record is not None
                return found, record
        return None

    # ---------------------------------------------------------------- the passes

    def fewer_faults(self, c: Candidate) -> tuple[Candidate, RunRecord] | None:
        """Zeller's ddmin over the faults (the empty plan first)."""
        if c.faults:
            got = self.first_failing([replace(c, faults=())])
            if got:
                return got
        return self._ddmin(c, lambda x: x.faults, lambda x, faults: replace(x, faults=faults))

    def fewer_steps(self, c: Candidate) -> tuple[Candidate, RunRecord] | None:
        """The shortest prefix of the kept steps that fails, else ddmin over the steps (each
        drop also tried with the one failpoint fault moved back: ``_shifted``)."""
        got = self.first_failing([c.kept(c.keep[:k]) for k in range(1, len(c.keep))])
        if got:
            return got
        return self._ddmin(c, lambda x: x.keep, lambda x, keep: x.kept(keep), shifted=True)

    def simpler_steps(self, c: Candidate) -> tuple[Candidate, RunRecord] | None:
        """Steps replaced by the simplest step, one at a time, while the run still fails
        (each replacement also tried with the one failpoint fault moved back)."""
        best: tuple[Candidate, RunRecord] | None = None
        while True:
            cur = best[0] if best else c
            tries = [cur.simplified(i) for i in cur.keep
                     if i not in cur.simple and self.kinds[i] != SIMPLE_KIND]
            got = self.first_failing(tries) or self.first_failing(_shifted(tries))
            if got is None:
                return best
            best = got

    def _ddmin(self, c: Candidate, parts: Callable[[Candidate], tuple[Any, ...]],
               rebuild: Callable[[Candidate, tuple[Any, ...]], Candidate], *,
               shifted: bool = False) -> tuple[Candidate, RunRecord] | None:
        """Zeller's ddmin over ``parts(c)``: drop a chunk while the rest still fails,
        halving the chunks when no drop does."""
        best: tuple[Candidate, RunRecord] | None = None
        cur, n = c, 2
        while len(parts(cur)) >= 2:
            items = parts(cur)
            size = -(-len(items) // n)
            rests = [rebuild(cur, items[:i] + items[i + size:])
                     for i in range(0, len(items), size)]  # each without one chunk
            got = self.first_failing(rests) or (
                self.first_failing(_shifted(rests)) if shifted else None)
            if got:
                best, cur, n = got, got[0], max(n - 1, 2)
                continue
            if n >= len(items):
                break
            n = min(2 * n, len(items))
        return best

    def earlier_occurrences(self, c: Candidate) -> tuple[Candidate, RunRecord] | None:
        best = None
        for i, f in enumerate(c.faults):
            if f.trigger != "failpoint" or not f.occurrence or f.occurrence <= 1:
                continue
            cur = best[0] if best else c
            tries = [replace(cur, faults=cur.faults[:i] + (replace(f, occurrence=o),)
                             + cur.faults[i + 1:]) for o in range(1, f.occurrence)]
            best = self.first_failing(tries) or best
        return best

    def shrink(self, start: Candidate, record: RunRecord,
               say: Callable[[str], None]) -> tuple[Candidate, RunRecord]:
        best = (start, record)
        passes = (("fewer faults", self.fewer_faults), ("fewer steps", self.fewer_steps),
                  ("simpler steps", self.simpler_steps),
                  ("earlier occurrences", self.earlier_occurrences))
        progress = True
        while progress:
            progress = False
            for name, step in passes:
                got = step(best[0])
                if got and got[0].size() < best[0].size():
                    best, progress = got, True
                    say(f"shrink: {name}: {len(got[0].faults)} fault(s), {len(got[0].keep)} "
                        f"step(s) ({len(got[0].simple)} simplified) still fail {self.check} "
                        f"({self.runs} runs so far)")
        return best


def _shifted(rests: list[Candidate]) -> list[Candidate]:
    """``rests`` with their one failpoint fault at each earlier occurrence: dropping or
    simplifying steps before a fault's landing place makes it land later by the hits those
    steps had, so such a candidate is tried with the fault moved back too (bounded: one
    failpoint fault only)."""
    out = []
    for rest in rests:
        points = [i for i, f in enumerate(rest.faults) if f.trigger == "failpoint"]
        if len(points) != 1 or not (rest.faults[points[0]].occurrence or 0) > 1:
            continue
        i = points[0]
        f = rest.faults[i]
        out += [replace(rest, faults=rest.faults[:i] + (replace(f, occurrence=o),)
                        + rest.faults[i + 1:]) for o in range(1, f.occurrence or 1)]
    return out


def target_check(record: dict[str, Any]) -> str:
    """The check a failing run failed (its first one that is about the system)."""
    if record["verdict"]["valid"] is not False:
        raise BadArguments(f"run {record['index']} did not fail (verdict "
                           f"{record['verdict']['valid']}); shrink a run that failed")
    checks = [str(c) for c in record["verdict"].get("checks") or [] if c not in NOT_CHECKS]
    if not checks:
        raise BadArguments(f"run {record['index']} failed no named check "
                           f"({record['verdict']['errors'][:1]}); nothing to shrink towards")
    return checks[0]


def story(spec: RunSpec, record: RunRecord, check: str) -> list[str]:
    """The shrunk run as lines a person reads: steps, faults, recoveries, the check."""
    scenario = scenario_of(spec.preset, spec.seed, steps=spec.steps, keep=spec.keep_steps,
                           simple=spec.simple_steps)
    lines = [f"The agent (seed {spec.seed}, preset {spec.preset}, {spec.durable_mode} mode) "
             f"takes {len(scenario.steps)} step(s):"]
    for s in scenario.steps:
        args = ", ".join(f"{k}={_short(v)}" for k, v in s.args.items())
        instead = (f" (simplified: in place of a {s.params['simplified_from']} step)"
                   if "simplified_from" in s.params else "")
        lines.append(f"  step {s.index}: {s.kind}: {s.tool}({args}){instead}")
    lines.append(f"The nemesis plans {len(record.plan.faults)} fault(s):")
    for i, f in enumerate(record.plan.faults):
        lines.append(f"  fault {i}: {f.describe()}: "
                     f"{'fired' if i in record.fired else 'did not fire'}")
    lines.append("What happened:")
    for op in record.history:
        if op["process"] in ("driver", "nemesis") and op["type"] != "invoke":
            lines.append(f"  {op['time']:7.2f}s {op['process']}: {op['f']} {op['type']} "
                         f"{_short(op['value'], 90)}")
    for ev in record.recoveries:
        lines.append(f"  recovery (driver at epoch {ev.get('epoch')}): {ev.get('kind')} "
                     f"{ev.get('tool') or ''} ({ev.get('cause')}) {_short(ev.get('detail'), 80)}")
    lines.append(f"The check {check} fails: "
                 f"{next((e for e in record.verdict.errors if e.startswith(check)), '')}")
    return lines


def _short(value: Any, limit: int = 40) -> str:
    text = json.dumps(value)  # strings quoted, newlines escaped: one line each
    return text if len(text) <= limit else text[: limit - 3] + "..."


def shrunk_document(spec: RunSpec, check: str, original: Candidate, best: Candidate,
                    replays: tuple[int, int], shrinker: Shrinker, seconds: float
                    ) -> dict[str, Any]:
    assert spec.plan is not None
    return {"seed": spec.seed, "campaign_mode": spec.campaign_mode,
            "durable_mode": spec.durable_mode, "backend": spec.backend, "preset": spec.preset,
            "steps": best.steps, "keep_steps": list(best.keep),
            "simple_steps": list(best.simple), "driver": spec.driver,
            "stale_kind": spec.stale_kind, "log_storage": spec.log_storage,
            **held_flags(spec.held),
            "plan": replace(spec.plan, faults=best.faults).to_json(), "check": check,
            "original": {"faults": len(original.faults), "steps": len(original.keep)},
            "replays": {"failed": replays[0], "of": replays[1]},
            "runs": shrinker.runs, "flaky_rejected": shrinker.flaky,
            "seconds": round(seconds, 1), "code": code_identity.current().to_json()}


def spec_of_shrunk(path: Path, work: Path, *, any_code: bool = False) -> RunSpec:
    """The run a ``shrunk.json`` describes (``chaos repro --plan``), refused when it was
    shrunk on other code (unless ``any_code``: ``code_identity.check_same``)."""
    try:
        doc = json.loads(path.read_text())
        spec = RunSpec(index=0, seed=doc["seed"], campaign_mode=doc["campaign_mode"],
                       durable_mode=doc["durable_mode"], backend=doc["backend"],
                       preset=doc["preset"], steps=doc["steps"], work_dir=work,
                       plan=FaultPlan.from_json(doc["plan"]), keep=True, driver=doc["driver"],
                       stale_kind=doc.get("stale_kind") or "race",
                       keep_steps=tuple(doc["keep_steps"]) if doc.get("keep_steps") else None,
                       simple_steps=tuple(doc.get("simple_steps") or ()),
                       log_storage=doc.get("log_storage") or DEFAULT_LOG_STORAGE,
                       held=held_of(doc))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BadArguments(f"--plan {path}: not a shrunk plan ({type(exc).__name__}: {exc}); "
                           f"pass the {SHRUNK_NAME} that chaos shrink wrote") from None
    warning = code_identity.check_same(doc.get("code"), str(path), any_code=any_code)
    if warning:
        print(warning, file=sys.stderr)
    return spec


def run_shrink(spec: RunSpec, record: dict[str, Any], dest: Path, *, jobs: int, tries: int,
               confirm: int, out: TextIO | None = None) -> int:
    """Shrink ``record`` (a failing run of ``spec``); write ``dest``; 0 when the shrunk plan
    failed the same check in every replay, 1 otherwise."""
    check = target_check(record)
    t0 = time.time()
    work = dest.parent / "shrink-work"
    spec = replace(spec, work_dir=work)
    assert spec.plan is not None
    original = Candidate.whole(spec.plan.faults, record["steps"])

    note = live.Campaign.open()
    try:
        with Progress(None, title=f"shrink {check}", transient=True) as progress:
            def say(text: str) -> None:
                progress.echo(text, out or sys.stdout)

            shrinker = Shrinker(spec, check, jobs=jobs, tries=tries, note=note,
                                progress=progress)
            return _shrink(shrinker, record, dest, original, confirm, say, t0)
    finally:
        note.close()


def _shrink(shrinker: Shrinker, record: dict[str, Any], dest: Path, original: Candidate,
            confirm: int, say: Callable[[str], None], t0: float) -> int:
    spec, check, tries, work = (shrinker.base, shrinker.check, shrinker.tries,
                                shrinker.base.work_dir)
    say(f"shrink: run {record['index']} (seed {spec.seed}) fails {check} with "
        f"{len(original.faults)} fault(s) and {original.steps} step(s); confirming")
    first = shrinker.first_failing([original])
    if first is None:
        say(f"shrink: the run's own plan does not fail {check} again "
            f"({'every time of ' + str(tries) if original.timed() else 'on replay'}): "
            "a failure that depends on timing; nothing to shrink from")
        shutil.rmtree(work, ignore_errors=True)
        return 1
    best, best_record = shrinker.shrink(original, first[1], say)
    failed = 0
    final = best_record
    for _ in range(confirm):
        r = shrinker.run_once(best)
        if shrinker.fails(r):
            failed += 1
            final = r
    shutil.rmtree(work, ignore_errors=True)
    told = story(shrinker.spec(best, spec.work_dir), final, check)
    doc = shrunk_document(spec, check, original, best, (failed, confirm), shrinker,
                          time.time() - t0)
    write_atomic(dest, json.dumps({**doc, "story": told}, indent=2) + "\n")
    for line in told:
        say(line)
    say(f"SHRUNK check={check} faults={len(original.faults)}->{len(best.faults)} "
        f"steps={len(original.keep)}->{len(best.keep)} simplified={len(best.simple)} "
        f"runs={shrinker.runs} "
        f"flaky_rejected={shrinker.flaky} replays_failed={failed}/{confirm} "
        f"seconds={doc['seconds']}")
    say(f"  reproduce: python -m chaos repro --plan {dest}")
    return 0 if failed == confirm else 1
