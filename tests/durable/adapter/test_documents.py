"""The adapter's documents as dataclasses (``durable.adapter.state``): a document an existing
log holds reads into its dataclass and writes back to the same bytes, so logs written
before the dataclasses still read, and logs written after read in older code."""

from __future__ import annotations

import json
from typing import Any

import pytest

from durable.adapter.snapshots import CheckpointRef
from durable.adapter.state import (
    CALL,
    CALL_DOC,
    IMAGE_DOC,
    IMAGE_STATE,
    SPACE,
    SPACE_DOC,
    CallRecord,
    CheckpointMark,
    ImageState,
    SpaceState,
    Stored,
)
from durable.log import Log
from durable.storage import MemoryStorage
from durable.storage.records import encode_json

#: Stored texts, copied from logs the adapter wrote before its documents were dataclasses
#: (campaign runs under ``results/`` and the runs of ``test_failpoint_order``), one per
#: shape: every field set and unset, base and call checkpoints, before and after the result.
EXISTING: list[tuple[Stored[Any], str]] = [
    (SPACE, ('{"space":"cua-run-0-c1","generation":1,"ready":true,"mode":null,'
             '"mode_reason":null,"checkpoint":null}')),
    (SPACE, ('{"space":"cua-g-c1","generation":1,"ready":false,"mode":null,"mode_reason":null,'
             '"checkpoint":null}')),
    (SPACE, ('{"space":"cua-run-0-c1","generation":1,"ready":true,"mode":"transactional",'
             '"mode_reason":"auto: a new conversation starts transactional","checkpoint":null}')),
    (SPACE, ('{"space":"cua-run-0-c1","generation":1,"ready":true,"mode":"checkpoint",'
             '"mode_reason":"a command left a process running in the Space (run-0:1:7.0:2@2)",'
             '"checkpoint":{"space":"cua-run-0-c1","id":"cua-run-0-c1.7.0.e2","call_id":"7.0",'
             '"entry":10}}')),
    (SPACE, ('{"space":"cua-g-c1","generation":1,"ready":true,"mode":"checkpoint",'
             '"mode_reason":"mode=checkpoint requested","checkpoint":{"space":"cua-g-c1",'
             '"id":"cua-g-c1.base-adopt.e1","call_id":null,"entry":null}}')),
    (SPACE, ('{"space":"cua-g-c1","generation":2,"ready":false,"mode":"checkpoint",'
             '"mode_reason":"mode=checkpoint requested","checkpoint":{"space":"cua-g-c1",'
             '"id":"cua-g-c1.3.0.e1","call_id":"3.0","entry":4}}')),
    (IMAGE_STATE, '{"stale":null,"files":5,"bytes":100}'),
    (IMAGE_STATE, '{"stale":"14 files exceed max_files=10","files":2,"bytes":11}'),
    (CALL, '{"call_id":"29.0","tool":"write","generation":1,"commands":[],"outcome":null}'),
    (CALL, ('{"call_id":"4.0","tool":"bash","generation":1,"commands":[{"key":"run-0:1:4.0:1@1",'
            '"epoch":1,"n":1}],"outcome":null}')),
    (CALL, ('{"call_id":"13.0","tool":"bash","generation":1,"commands":[{"key":'
            '"run-0:1:13.0:1@2","epoch":2,"n":1}],"outcome":{"content":"changed\\n",'
            '"is_error":false,"interrupted":false,"details":{"exit_code":0}}}')),
    (CALL, 'null'),
]


@pytest.mark.parametrize(("stored", "text"), EXISTING,
                         ids=[f"{s.doc.kind}-{i}" for i, (s, _t) in enumerate(EXISTING)])
def test_an_existing_document_round_trips(stored: Stored[Any], text: str) -> None:
    raw = json.loads(text)
    value = stored.load(raw)
    assert stored.dump(value) == raw
    assert encode_json(stored.dump(value)) == text


def test_the_initial_values_are_the_old_ones() -> None:
    assert SPACE_DOC.initial == {"space": None, "generation": 0, "ready": False, "mode": None,
                                 "mode_reason": None, "checkpoint": None}
    assert IMAGE_DOC.initial == {"stale": None, "files": 0, "bytes": 0}
    assert CALL_DOC.initial is None
    assert SPACE.load(SPACE_DOC.initial_value()) == SpaceState()
    assert IMAGE_STATE.load(IMAGE_DOC.initial_value()) == ImageState()


def test_typed_documents_through_a_log() -> None:
    """Written as dataclasses, read back raw (as chaos and older code read them) and typed."""
    log = Log.open(MemoryStorage())
    conv = log.create_root("a")
    assert SPACE.read(log, conv) == SpaceState() and CALL.read(log, conv) is None
    mark = CheckpointMark("cua-s-c1", "cua-s-c1.3.0.e1", "3.0")
    state = SpaceState("cua-s-c1", 2, True, "checkpoint", "mode=checkpoint requested", mark)
    record = CallRecord.from_json(json.loads(EXISTING[10][1]))
    with log.transaction() as tx:
        SPACE.write(tx, conv, state)
        assert SPACE.read_in(tx, conv) == state
        CALL.write(tx, conv, record)
    assert SPACE.read(log, conv) == state and CALL.read(log, conv) == record
    raw = log.read_doc(conv, SPACE_DOC).value
    assert raw["checkpoint"] == {"space": "cua-s-c1", "id": "cua-s-c1.3.0.e1",
                                 "call_id": "3.0", "entry": None}
    assert mark.ref == CheckpointRef("cua-s-c1", "cua-s-c1.3.0.e1")
    assert record.commands[-1].key == "run-0:1:13.0:1@2"
    assert record.outcome is not None and record.outcome.details == {"exit_code": 0}
