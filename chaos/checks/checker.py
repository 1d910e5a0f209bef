"""The invariant checker: every guarantee of docs/architecture.md, each as its own named check.

It works on an ``Observation`` (plain data taken from the log, the Space, the Space's
ledgers and fence records, and the effects file after a clean driver finished the run), so
``chaos analyze`` can re-check stored records without re-running anything. The checks live
in ``chaos/checks/``, one module each:

- ``run``: the clean driver finished the session and the run made progress;
- ``G1`` state: the workspace (content, permission bits, symlinks) equals the state the
  committed log implies, and in transactional mode the log's image equals it too;
- ``G2`` never twice: no shell command that started was started again by recovery (the
  Space's exec ledgers, earlier generations included);
- ``G3`` fenced before restore: no process started before a restore or revert (of an older
  epoch, or the restoring driver's own) was alive when it changed the workspace;
- ``G4`` stale writers: no entry landed from a driver after a newer epoch took the log
  over, and no refusal of a stale driver became a tool result;
- ``G5`` once and faithful: every call took effect once, in order, with the result its step
  gives (real exit status and output, even when replayed or adopted); the input was admitted
  once; never-tools ran at most once; no unplanned error or interruption.

Its data (the observation, the verdict) is ``chaos.checks.model``'s. Verdicts are
three-valued (Jepsen): ``True``, ``False``, or ``"unknown"`` when a check could
not decide (it lacked data, or crashed); a crashing check never aborts the campaign.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from chaos.checks.implied import implied
from chaos.checks.model import Observation, Verdict, merge
from chaos.checks.registry import run_checks
from chaos.modes.second_session import second_scenario
from scenarios import Scenario

if TYPE_CHECKING:
    from chaos.checks.golden import Golden

def check(scenario: Scenario, obs: Observation, *, campaign_mode: str,
          golden: Golden | None = None) -> Verdict:
    """Run every check; see ``chaos.checks.registry``. A redrive race's second session (``second``)
    ran on the first's Space after it: it is checked in full from the state the first
    session's log implies, and the first's workspace check (G1) is left to it (the Space
    holds both sessions' changes; the second's G1 sees a wrong first state too)."""
    if obs.second is None:
        return _with_forks(run_checks(scenario, obs, campaign_mode, golden=golden), scenario,
                           obs, campaign_mode)
    first = run_checks(scenario, obs, campaign_mode, skip=("G1",))
    after_first = implied(scenario, obs.calls, disk_filled=obs.disk_filled).workspace
    scenario_b = replace(second_scenario(obs.second["scenario"]), initial=after_first)
    second = run_checks(scenario_b, _part_of(obs, obs.second["observation"]), campaign_mode)
    checks = first.checks + [c for c in second.checks if c not in first.checks]
    return Verdict(merge([first.valid, second.valid]),
                   first.errors + [f"second session: {e}" for e in second.errors], checks)


def _with_forks(verdict: Verdict, scenario: Scenario, obs: Observation,
                campaign_mode: str) -> Verdict:
    """``verdict`` and every check on each fork of the agent's conversation: a fork's
    Space must hold what its own history implies (its parent's calls up to the fork, then
    its own), and its calls must have taken effect once, faithfully. A scenario that forks
    must have its fork once its agent finished."""
    verdicts, errors, checks = [verdict.valid], list(verdict.errors), list(verdict.checks)
    if scenario.fork_after is not None and obs.final_outcome_done and not obs.forks:
        verdicts.append(False)
        errors.append(f"run finished: the agent forks after step {scenario.fork_after}, "
                      "but the log has no fork")
        checks += [] if "run" in checks else ["run"]
    for fork in obs.forks:
        got = run_checks(scenario, _part_of(obs, fork["observation"]), campaign_mode,
                         skip=("G6",))
        verdicts.append(got.valid)
        errors += [f"fork c{fork['conversation']} (after step {fork['after_step']}): {e}"
                   for e in got.errors]
        checks += [c for c in got.checks if c not in checks]
    return Verdict(merge(verdicts), errors, checks)


def _part_of(run: Observation, part: dict[str, Any]) -> Observation:
    """The observation of a part of the run (a fork, a race's second session), from its
    JSON, with what holds for the whole run: whether its workspace disk was filled."""
    return replace(Observation.from_json(part), disk_filled=run.disk_filled)
