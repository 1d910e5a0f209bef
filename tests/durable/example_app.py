"""An app for ``python -m durable run``: only a ``start`` function, no driver module of its
own. Its scripted model appends the session's input to ``notes.txt`` with bash, then writes
``done.txt``."""

from __future__ import annotations

import shlex

from durable.coding_tools import coding_tools
from durable.models import PlannedCall, ScriptedModel
from durable.session_driver import Session, Started
from durable.tools import ToolRegistry

REQUEST_ID = "example-app-input"


def start(session: Session) -> Started:
    text = session.env.input
    plan = [PlannedCall(0, "bash", {"command": f"printf '%s\\n' {shlex.quote(text)} >> notes.txt"}),
            PlannedCall(1, "write", {"path": "done.txt", "content": "done\n"})]
    harness = session.open_harness(models=ScriptedModel(plan),
                                   registry=ToolRegistry(coding_tools()))
    return session.started(harness.root("example").submit(content=text,
                                                          request_id=REQUEST_ID))


not_a_function = 42
