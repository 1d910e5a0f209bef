"""Models: the ``Model`` protocol and the deterministic scripted model.

A model takes the conversation's messages and the tool specs and returns an assistant
message, possibly with tool calls. The harness may call it again for the same turn after a
crash (the assistant entry had not been committed), so a model used under the crash
campaign must be a function of the messages it is given: the scripted model is exactly that.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from .errors import DurableError


class ModelError(DurableError):
    """The model could not answer. The submission ends ``unanswered`` with this reason."""


@dataclass(frozen=True)
class ToolCallRequest:
    name: str
    args: dict[str, Any]


@dataclass(frozen=True)
class AssistantMessage:
    text: str = ""
    tool_calls: list[ToolCallRequest] = field(default_factory=list)
    #: Free-form data kept with the entry (the scripted model records its step here).
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ModelRequest:
    conversation: int
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]


class Model(Protocol):
    def complete(self, request: ModelRequest) -> AssistantMessage: ...


@dataclass(frozen=True)
class PlannedCall:
    """One step of a script: a tool call the scripted model will make."""

    step: int
    name: str
    args: dict[str, Any]


#: Decides whether an interrupted step is issued again: ``(step, attempt) -> bool``.
ReissueRule = Callable[[int, int], bool]


class ScriptedModel:
    """Plays a list of planned calls, one per turn, then answers ``final_text``.

    It keeps no state: the next step is read from the messages (each assistant message it
    wrote carries ``meta = {"step": k, "attempt": a}``). After an interrupted result for step
    k it asks ``reissue(k, a)`` whether to issue step k again (attempt a + 1) or move on.
    """

    def __init__(
        self,
        plan: list[PlannedCall],
        *,
        reissue: ReissueRule | None = None,
        final_text: str = "All steps done.",
        max_attempts: int = 3,
    ) -> None:
        self.plan = plan
        self.reissue = reissue or (lambda step, attempt: False)
        self.final_text = final_text
        self.max_attempts = max_attempts

    def next_call(self, messages: list[dict[str, Any]]) -> tuple[int, int] | None:
        """(step, attempt) of the next call to make, or ``None`` when the script is done."""
        last: tuple[int, int] | None = None
        last_call_id: str | None = None
        for m in messages:
            if m["role"] == "assistant" and "step" in m.get("meta", {}):
                last = (m["meta"]["step"], m["meta"]["attempt"])
                calls = m.get("tool_calls") or []
                last_call_id = calls[0]["id"] if calls else None
        if last is None:
            return (0, 1) if self.plan else None
        step, attempt = last
        result = next(
            (m for m in messages if m["role"] == "tool" and m["call_id"] == last_call_id), None
        )
        if (
            result is not None
            and result.get("interrupted")
            and attempt < self.max_attempts
            and self.reissue(step, attempt)
        ):
            return step, attempt + 1
        nxt = step + 1
        return (nxt, 1) if nxt < len(self.plan) else None

    def complete(self, request: ModelRequest) -> AssistantMessage:
        nxt = self.next_call(request.messages)
        if nxt is None:
            return AssistantMessage(self.final_text)
        step, attempt = nxt
        call = self.plan[step]
        return AssistantMessage(
            f"step {step} attempt {attempt}: {call.name}",
            [ToolCallRequest(call.name, dict(call.args))],
            {"step": step, "attempt": attempt},
        )
