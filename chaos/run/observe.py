"""Turn a finished run (its log, its Space, its effects file) into plain data.

The runner observes once, after a clean driver finished the session; the checker and the
reports only ever see the ``Observation`` and the agent's history built here from the log
(``agent_history``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chaos.checks.model import Observation, ObservedCall
from chaos.space_providers import CampaignSpaces, Restorable
from durable.adapter import IMAGE_DOC, SPACE_DOC
from durable.adapter.image import Image
from durable.adapter.state import RECOVERY_KEY
from durable.errors import SpaceError
from durable.log import ROOT_CONVERSATION, Log
from durable.session_log import open_for_audit
from durable.storage.epochs import EpochHistory
from durable.virtual import Tree, virtual
from durable.virtual.workspace import rows_of
from scenarios.host_tools import read_effects
from scenarios.steps import LOG_FILE
from spacesd.audit import read_state
from spacesd.protocol import ScanEntry


def _shown(content: str, limit: int = 2000) -> str:
    """``content`` cut for people: its head and its tail when it is long."""
    if len(content) <= limit:
        return content
    half = limit // 2
    return f"{content[:half]}\n[... {len(content) - limit} characters ...]\n{content[-half:]}"


def calls_of(log: Log, conversation: int = ROOT_CONVERSATION) -> list[ObservedCall]:
    out: list[ObservedCall] = []
    results = {e.data["call_id"]: e for e in log.entries(conversation) if e.kind == "tool_result"}
    for e in log.entries(conversation):
        if e.kind != "assistant":
            continue
        meta = e.data.get("meta", {})
        for call in e.data.get("tool_calls", []):
            r = results.get(call["id"])
            status = None
            if r is not None:
                status = ("info" if r.data.get("interrupted") else
                          "fail" if r.data.get("is_error") else "ok")
            out.append(ObservedCall(
                step=meta.get("step", -1), attempt=meta.get("attempt", 1), call_id=call["id"],
                tool=call["name"], args=call["args"], invoked_ms=e.created_ms, result=status,
                result_entry=r.id if r else None,
                content=_shown(r.data.get("content", "")) if r else "",
                completed_ms=r.created_ms if r else None,
                content_sha256=hashlib.sha256(r.data.get("content", "").encode()).hexdigest()
                if r else ""))
    return out


def agent_history(calls: list[ObservedCall], t0: float) -> list[dict[str, Any]]:
    """The agent's operations: an ``invoke`` per call at its assistant entry and, when its
    result was committed, the completion (``ok``, ``fail``, or ``info`` for interrupted) at
    the result entry; times in seconds after ``t0``."""
    ops: list[dict[str, Any]] = []
    for c in calls:
        value = {"step": c.step, "call": c.call_id}
        ops.append({"process": "agent", "type": "invoke", "f": c.tool, "value": value,
                    "time": round(c.invoked_ms / 1000 - t0, 4)})
        if c.result is not None and c.completed_ms is not None:
            ops.append({"process": "agent", "type": c.result, "f": c.tool, "value": dict(value),
                        "time": round(c.completed_ms / 1000 - t0, 4)})
    return ops


def recovery_events(log: Log, conversation: int = ROOT_CONVERSATION) -> list[dict[str, Any]]:
    """The adapter's recovery events in ``conversation``'s history (a fork's: its parent's
    up to the fork too), each with the conversation that recorded it."""
    return [{**e.data[RECOVERY_KEY], "entry": e.id, "time_ms": e.created_ms,
             "conversation": e.conversation}
            for e in log.entries(conversation)
            if e.kind == "system" and RECOVERY_KEY in e.data]


def save_ledger(spaces: CampaignSpaces, space_name: str, dest: Path, why: str) -> dict[str, Any]:
    """The exec ledger and fence records of a Space as they are now (``why``: what the
    runner is about to do to it, or ``final``), saved under ``dest`` for the record."""
    spaces.save_state(space_name, dest)
    return read_ledger(dest, why)


def read_ledger(dest: Path, why: str) -> dict[str, Any]:
    """The ledger record of the audit files a provider saved under ``dest``."""
    return {"why": why, "audit": read_state(str(dest)).to_json()}


def kept_ledgers(dest: Path) -> list[dict[str, Any]]:
    """The ledger records of the audit files a lost microVM Space kept before each of its
    machine restores (``MicroVMSpaces.lose`` moves them under ``dest``), oldest first."""
    history = dest / "audit-history"
    return [read_ledger(kept, "before a machine restore")
            for kept in (sorted(history.iterdir()) if history.is_dir() else [])]


def unread_ledger(why: str) -> dict[str, Any]:
    """The record of a Space generation whose audit files could not be saved: with one,
    the run's audits cannot decide (``Observation.ledgers`` is None)."""
    return {"why": why, "audit": None}


def observe(run_dir: Path, spaces: CampaignSpaces, space_name: str, *, session: str,
            epoch: int, final_exit: int | None, final_done: bool,
            ledgers: list[dict[str, Any]], stale_error: str | None = None,
            foreign_keys: list[str] | None = None,
            conversation: int = ROOT_CONVERSATION) -> tuple[Observation, list[dict[str, Any]]]:
    """The run's observation of ``conversation`` (the agent's, or its fork's) in its Space
    ``space_name``, and its recovery events. ``session``: the token of the run's
    session (every key of its Space must carry it). ``ledgers``: those the runner saved
    from earlier generations of the Space; the current one's is added here. ``epoch``: the
    newest the runner launched; a driver that ran above it (``EpochTaken``) raised the
    log's floor, which is used then. ``foreign_keys``: keys another log of this session
    started in the Space (stale mode's foreign kind)."""
    facts = _log_facts(run_dir, epoch, conversation)
    rows: list[ScanEntry] = []
    log_txt = ""
    try:
        client = spaces.connect(space_name, epoch=facts.epoch)
        rows = client.scan().entries
        if any(e.path == LOG_FILE for e in rows):
            log_txt = client.read_file(LOG_FILE).decode("utf-8", "replace")
    except SpaceError:
        rows = []  # the Space is gone: the hash comparison reports it
    all_ledgers: list[dict[str, Any]] = list(ledgers)
    # A lost generation's could not be saved: the audits cannot decide.
    decided = not any(ledger["audit"] is None for ledger in ledgers)
    # A machine restore takes the Space's audit files back in time: what they said before
    # each one was kept on the host (microVM Spaces).
    history = spaces.audit_history(space_name) if isinstance(spaces, Restorable) else []
    for kept in history:
        all_ledgers.append({"why": "before a machine restore", "audit": read_state(str(kept))
                            .to_json()})
    try:
        final = "final" if conversation == ROOT_CONVERSATION else f"final-c{conversation}"
        all_ledgers.append(save_ledger(spaces, space_name, run_dir / "ledgers" / final,
                                       "final"))
    except SpaceError:
        if spaces.exists(space_name):
            decided = False  # there but unreadable: the audits cannot decide
        # else gone: the earlier generations' ledgers are all there is
    obs = Observation(
        calls=facts.calls, workspace=rows, log_txt=log_txt,
        effects=read_effects(run_dir / "effects"), final_exit=final_exit,
        final_outcome_done=final_done, end_mode=facts.space["mode"],
        image_hash=facts.image.hash() if facts.space["mode"] == "transactional" else None,
        image_stale=facts.image_doc["stale"],
        mode_switch_entry=facts.switch, events=facts.events, inputs=facts.inputs,
        epoch_raises=list(facts.history.raises),
        entry_epochs=sorted(facts.history.entry_epochs.items()),
        ledgers=all_ledgers if decided else None,
        stale_error=stale_error, session=session, foreign_keys=list(foreign_keys or []),
        conversation=conversation)
    return obs, facts.events


@dataclass
class _LogFacts:
    """What the observation takes from the session's log."""

    calls: list[ObservedCall]
    events: list[dict[str, Any]]
    inputs: list[tuple[int, str | None]]
    space: dict[str, Any]
    image_doc: dict[str, Any]
    image: Image
    switch: int | None
    history: EpochHistory
    epoch: int


def _log_facts(run_dir: Path, epoch: int, conversation: int) -> _LogFacts:
    """``conversation``'s facts: a fork's calls, events and image are those of its whole
    history (its parent's up to the fork, then its own); its inputs are its own."""
    storage = open_for_audit(run_dir / "state")
    history = storage.epoch_history()
    epoch = max([epoch, *(raised[0] for raised in history.raises)])
    log = Log.open(storage)
    try:
        events = recovery_events(log, conversation)
        entries = log.entries(conversation)
        image = Image()
        image.fold_history(entries)
        return _LogFacts(
            calls=calls_of(log, conversation), events=events,
            inputs=[(e.id, e.data.get("request_id")) for e in entries
                    if e.kind == "input" and e.conversation == conversation],
            space=log.read_doc(conversation, SPACE_DOC).value,
            image_doc=log.read_doc(conversation, IMAGE_DOC).value, image=image,
            switch=next((ev["entry"] for ev in events if ev["kind"] == "mode"
                         and ev["mode"] == "checkpoint"), None),
            history=history, epoch=epoch)
    finally:
        log.close()


def observe_virtual(run_dir: Path, initial: Tree, *, session: str, epoch: int,
                    final_exit: int | None, final_done: bool,
                    conversation: int = ROOT_CONVERSATION
                    ) -> tuple[Observation, list[dict[str, Any]]]:
    """The observation of ``conversation`` on a virtual workspace: its workspace is what
    the log holds (read as the tools read it, every content checked against its hash,
    blobs included). There is no Space, so no exec ledger or fence records: G2 and G3 have
    nothing to audit (``ledgers=[]``), G1 and G5 carry the run."""
    facts = _log_facts(run_dir, epoch, conversation)
    log = Log.open(open_for_audit(run_dir / "state"))
    try:
        tree = virtual(initial=initial).snapshot(log, conversation)
    finally:
        log.close()
    rows = [row.entry(path) for path, row in sorted(rows_of(tree).items())]
    log_node = tree.get(LOG_FILE)
    obs = Observation(
        calls=facts.calls, workspace=rows,
        log_txt=log_node.data.decode("utf-8", "replace") if log_node else "",
        effects=read_effects(run_dir / "effects"), final_exit=final_exit,
        final_outcome_done=final_done, end_mode="transactional",
        image_hash=facts.image.hash(), image_stale=None, events=facts.events,
        inputs=facts.inputs, epoch_raises=list(facts.history.raises),
        entry_epochs=sorted(facts.history.entry_epochs.items()), ledgers=[],
        session=session, dirs_implied=True, conversation=conversation)
    return obs, facts.events
