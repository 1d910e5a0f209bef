"""The scripted agent's fork (``Scenario.fork_after``), as the campaign's driver runs it.

Once the agent's conversation is done, it is forked at the result of the step the scenario
names, and the fork plays the steps after that one again: its Space must start from the
state as of that result (a workspace or machine checkpoint of the parent, or the log's
image), not from the parent's newest state. The fork is made once: a later driver finds
the one an earlier driver made (the only conversation whose parent is the root), and its
input is admitted once (``FORK_REQUEST_ID``).
"""

from __future__ import annotations

from dataclasses import dataclass

from durable.errors import PermanentFailure
from durable.harness import Outcome, Submission
from durable.log import ROOT_CONVERSATION, Log
from durable.session_driver import Session, SessionRun

FORK_REQUEST_ID = "campaign-fork"


def fork_entry(log: Log, step: int) -> int:
    """The entry of the root conversation the fork starts after: the last result of
    ``step`` (its committed one; an interrupted step that was not issued again has only
    its interrupted one)."""
    history = log.entries(ROOT_CONVERSATION)
    calls = {c["id"] for e in history if e.kind == "assistant"
             and e.data.get("meta", {}).get("step") == step
             for c in e.data.get("tool_calls", [])}
    results = [e.id for e in history if e.kind == "tool_result" and e.data["call_id"] in calls]
    if not results:
        raise PermanentFailure(f"the scenario forks after step {step}, but the conversation "
                               "has no result of that step")
    return results[-1]


def forks_of(log: Log) -> list[int]:
    """The conversations forked from the root, oldest first."""
    return [c.id for c in log.conversations() if c.parent_conversation == ROOT_CONVERSATION]


@dataclass
class ForkedRun:
    """The ``Started`` of a forking agent: the root's run, then the fork's (see the module
    docstring); ``ensure_space`` ensures the Space of whichever runs."""

    session: Session
    root: Submission
    after_step: int

    def __post_init__(self) -> None:
        self.current: SessionRun = self.session.started(self.root)

    def wait(self) -> Outcome:
        outcome = self.root.wait()
        if not outcome.done:
            return outcome
        harness = self.root.harness
        forks = forks_of(harness.log)
        fork = forks[0] if forks else harness.log.fork(
            ROOT_CONVERSATION, fork_entry(harness.log, self.after_step))
        self.current = self.session.started(harness.conversation(fork).submit(
            content=f"play the steps after {self.after_step} again",
            request_id=FORK_REQUEST_ID))
        return self.current.wait()

    def ensure_space(self) -> None:
        self.current.ensure_space()

    def close(self) -> None:
        self.current.close()
