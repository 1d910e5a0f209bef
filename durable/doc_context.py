"""Documents in the model's context: ``prompt_docs([Todos])`` gives the harness a system
message per document at every model turn, with the document's value as it is in the
storage then (so an edit your app made from another process is what the model sees next).
The messages are context, not entries: nothing of them is written to the log.

    harness = Harness.open(storage, models=model, registry=registry,
                           context=prompt_docs([Todos]))
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from .docs import Doc
from .log import Log

#: What the harness calls before each model turn: the messages put before the history.
ContextFn = Callable[[Log, int], list[dict[str, Any]]]


def prompt_docs(docs: list[Doc], *, intro: str = "The current value of document") -> ContextFn:
    """One system message per document of ``docs``, read fresh from the storage each turn:
    ``<intro> <kind> (revision N):`` and its JSON."""

    def context(log: Log, conversation: int) -> list[dict[str, Any]]:
        out = []
        for doc in docs:
            value = log.read_doc(conversation, doc, fresh=True)
            out.append({"role": "system", "content": f"{intro} {doc.kind} (revision "
                        f"{value.revision}):\n{json.dumps(value.value, indent=2, sort_keys=True)}"})
        return out

    return context
