"""The contract of ``lose`` (``chaos.space_providers.CampaignSpaces``), checked the same way
on every backend: the saved audit files hold everything the Space answered before it was
lost, and a ``create`` after the loss makes a new Space.

Found by the docker campaign (G3): a loss that saved the ledger and then deleted the Space
let a driver fence and revert in between, and the saved records missed what it was told
had happened."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from durable.errors import SpaceError
from spacesd import audit


def check_a_loss_is_one_instant(spaces: Any, name: str, keep: Path) -> None:
    """A client fences the Space at epoch 2, 3, ... as fast as it is answered while the
    Space is lost: every epoch it was answered for is in the saved fence records."""
    spaces.create(name)
    first = spaces.connect(name, epoch=1)
    space_id = first.describe()["space_id"]
    answered: list[int] = []
    some = threading.Event()

    def fence() -> None:
        epoch = 2
        while True:
            client = first.with_epoch(epoch)
            client.timeout, client.retry_for = 10.0, 0.5
            try:
                client.advance_epoch(epoch)
            except SpaceError:
                return  # lost: nothing more is answered
            answered.append(epoch)
            if len(answered) >= 3:
                some.set()
            epoch += 1

    fencer = threading.Thread(target=fence, daemon=True)
    fencer.start()
    assert some.wait(120), "the Space answered no advance"
    spaces.lose(name, keep)
    fencer.join(120)
    assert not fencer.is_alive(), "a request to the lost Space was still answered"
    saved = {f["epoch"] for f in audit.read_state(str(keep)).fences if f["t"] == "advance"}
    assert set(answered) <= saved, f"answered but not saved: {sorted(set(answered) - saved)}"
    assert not spaces.exists(name)
    spaces.create(name)  # as a driver does after the loss: a new Space, never the old one
    assert spaces.connect(name, epoch=1).describe()["space_id"] != space_id
