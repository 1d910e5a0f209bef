"""One JSON codec for stored records (``durable.record_codec``): the stored forms stay what
logs already hold, byte for byte, and bad input is refused with the record and field named."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import ClassVar, Literal

import pytest

from durable.adapter.state import (
    CallRecord,
    CheckpointMark,
    CommandMark,
    ImageState,
    RecoveryEvent,
    SpaceState,
)
from durable.record_codec import OMIT_NONE, JsonRecord
from durable.tools import ToolResult


def test_the_adapters_documents_encode_as_the_logs_already_hold_them() -> None:
    """Key for key, in the order the hand-written encoders wrote (a value read and written
    back must encode to the same bytes as before)."""
    mark = CheckpointMark("s", "c1", "call-1", 7)
    state = SpaceState("s", 3, True, "checkpoint", "over_limits", mark)
    assert json.dumps(state.to_json()) == json.dumps({
        "space": "s", "generation": 3, "ready": True, "mode": "checkpoint",
        "mode_reason": "over_limits",
        "checkpoint": {"space": "s", "id": "c1", "call_id": "call-1", "entry": 7}})
    assert "space_id" not in state.to_json(), "absent before ids, as old documents were"
    assert json.dumps(SpaceState(space_id="id-1").to_json()).endswith('"space_id": "id-1"}')
    call = CallRecord("call-1", "bash", 2, (CommandMark("k", 4, 1),),
                      ToolResult("out", details={"exit": 0}))
    assert json.dumps(call.to_json()) == json.dumps({
        "call_id": "call-1", "tool": "bash", "generation": 2,
        "commands": [{"key": "k", "epoch": 4, "n": 1}],
        "outcome": {"content": "out", "is_error": False, "interrupted": False,
                    "details": {"exit": 0}}})
    assert ImageState("too big", 3, 10).to_json() == {"stale": "too big", "files": 3,
                                                      "bytes": 10}
    for record in (state, SpaceState(space_id="id-1"), call, ImageState(), mark,
                   CallRecord("c", "write", 0)):
        assert type(record).from_json(json.loads(json.dumps(record.to_json()))) == record


def test_a_record_written_before_a_field_existed_reads_with_its_default() -> None:
    old = {"kind": "ran", "mode": "checkpoint", "call_id": "c", "detail": "",
           "conversation": 1}  # before tool, cause and epoch
    event = RecoveryEvent.from_entry({"hidden": True, "recovery": old})
    assert (event.tool, event.cause, event.epoch) == (None, None, None)
    assert RecoveryEvent.from_entry(event.to_entry()) == event


@dataclass(frozen=True)
class _Inner(JsonRecord):
    n: int


@dataclass(frozen=True)
class _Outer(JsonRecord):
    name: str
    inners: tuple[_Inner, ...] = ()
    pair: tuple[int, str] | None = None
    maybe: _Inner | None = field(default=None, metadata=OMIT_NONE)


@dataclass(frozen=True)
class _Lenient(JsonRecord):
    json_extra: ClassVar[Literal["refuse", "ignore"]] = "ignore"
    a: int = 0


def test_nested_records_tuples_and_optionals_read_back_as_their_types() -> None:
    rec = _Outer("x", (_Inner(1), _Inner(2)), (3, "y"), _Inner(4))
    raw = json.loads(json.dumps(rec.to_json()))
    assert raw == {"name": "x", "inners": [{"n": 1}, {"n": 2}], "pair": [3, "y"],
                   "maybe": {"n": 4}}
    assert _Outer.from_json(raw) == rec
    assert _Outer("x").to_json() == {"name": "x", "inners": [], "pair": None}


def test_bad_input_is_refused_naming_the_record_and_the_field() -> None:
    with pytest.raises(ValueError, match=r"_Outer: unknown field\(s\) 'extra'; known: name"):
        _Outer.from_json({"name": "x", "extra": 1})
    with pytest.raises(ValueError, match="_Outer: field 'name' is missing"):
        _Outer.from_json({})
    with pytest.raises(ValueError, match=r"_Outer.inners: expected a list"):
        _Outer.from_json({"name": "x", "inners": 5})
    with pytest.raises(ValueError, match=r"_Outer.inners: _Inner: unknown field\(s\) 'm'"):
        _Outer.from_json({"name": "x", "inners": [{"m": 1}]})
    with pytest.raises(ValueError, match=r"_Outer.pair: expected 2 items"):
        _Outer.from_json({"name": "x", "pair": [1]})
    with pytest.raises(ValueError, match="_Inner: expected a JSON object"):
        _Inner.from_json([1])  # type: ignore[arg-type]  # bad input on purpose
    with pytest.raises(ValueError, match=r"_Inner.n: expected int, got '1'"):
        _Inner.from_json({"n": "1"})
    with pytest.raises(ValueError, match=r"_Inner.n: expected int, got True"):
        _Inner.from_json({"n": True})
    with pytest.raises(ValueError, match=r"_Outer.pair: expected str, got 4"):
        _Outer.from_json({"name": "x", "pair": [3, 4]})
    assert _Lenient.from_json({"a": 1, "gone": 2}) == _Lenient(1), "older records had more"
