"""How a conversation's Space that is not ready (lost, half made by a crash, or not made
yet) is brought to the log's state, as a pure function: ``decide_rebuild(RebuildFacts) ->
RebuildDecision``. ``space_keeper`` gathers the facts and carries the decision out; its
events are cells of the recovery table like a call's
(``chaos.campaign.coverage.table_cells`` counts them).

A checkpoint-mode conversation restores its recorded checkpoint, unless the checkpoint was
inside the lost Space (no durable ``CheckpointStore``): then nothing holds the state and
the conversation fails for good. Everything else is reimaged from the log's image. A new
Space generation is committed first unless the Space recorded is this one and exists (a
rebuild a crash cut short).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal, get_args

from .state import Cause, EventKind, Mode


@dataclass(frozen=True)
class RebuildFacts:
    """What ``cua.space`` and the provider say when a conversation's Space is not ready."""

    #: The conversation's mode, None before it was decided (no call yet).
    mode: Mode | None
    #: Which Space ``cua.space`` names: this conversation's, none, or another's (a fork's
    #: parent).
    recorded: Literal["this", "none", "other"]
    #: The Space exists in the provider.
    exists: bool
    #: A checkpoint is recorded.
    checkpoint: bool
    #: ... and it lives only inside this Space (no durable ``CheckpointStore``).
    checkpoint_inside: bool


@dataclass(frozen=True)
class RebuildDecision:
    #: restore the checkpoint, reimage from the image, or fail (its checkpoint is lost).
    action: Literal["restore", "reimage", "fail"]
    cause: Cause
    #: Commit a new Space generation before creating the Space.
    new_generation: bool

    @property
    def events(self) -> tuple[EventKind, ...]:
        events: dict[str, tuple[EventKind, ...]] = {
            "restore": ("restored",), "reimage": ("reimaged",), "fail": ()}
        return events[self.action]


def decide_rebuild(facts: RebuildFacts) -> RebuildDecision:
    """How to bring a Space that is not ready to the log's state."""
    lost = facts.recorded == "this" and not facts.exists
    cause: Cause = ("space_lost" if lost else
                    "unfinished" if facts.recorded == "this" else "new_space")
    new_generation = lost or facts.recorded != "this"
    if facts.mode == "checkpoint" and facts.checkpoint:
        if facts.checkpoint_inside and lost:
            return RebuildDecision("fail", cause, new_generation)
        return RebuildDecision("restore", cause, new_generation)
    return RebuildDecision("reimage", cause, new_generation)


def all_rebuild_facts() -> Iterator[RebuildFacts]:
    """Every consistent ``RebuildFacts`` (a checkpoint inside the Space is a checkpoint)."""
    records: tuple[Literal["this", "none", "other"], ...] = ("this", "none", "other")
    for mode, recorded, exists, checkpoint, inside in itertools.product(
            (None, *get_args(Mode)), records, (True, False), (True, False), (True, False)):
        if checkpoint or not inside:
            yield RebuildFacts(mode, recorded, exists, checkpoint, inside)
