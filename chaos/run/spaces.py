"""The run's own use of its Spaces: seed a scenario's initial workspace, keep a failed
run's final workspace for people and ``repro``, and delete every Space at the end."""

from __future__ import annotations

import sys
from pathlib import Path

from chaos.space_providers import CampaignSpaces
from scenarios.plan import Scenario


def seed_space(spaces: CampaignSpaces, name: str, scenario: Scenario) -> None:
    """Create the Space ``name`` with ``scenario``'s initial workspace."""
    spaces.create(name)
    client = spaces.connect(name, epoch=0)
    for path, (data, mode) in sorted(scenario.initial.files.items()):
        client.write_file(path, data, mode=mode)
    for path, target in sorted(scenario.initial.links.items()):
        client.symlink(path, target)
    for path in sorted(scenario.initial.dirs):
        client.mkdir(path)  # the empty ones; the rest exist as the files' parents


def save_workspace(spaces: CampaignSpaces, name: str, epoch: int, run_dir: Path) -> None:
    """The Space's workspace as ``workspace.tar`` in ``run_dir`` (read at ``epoch``); what
    went wrong, if anything, in ``workspace.error`` beside the rest of the run."""
    try:
        client = spaces.connect(name, epoch=epoch)
        client.checkpoint_create("final-workspace")
        with open(run_dir / "workspace.tar", "wb") as f:
            f.writelines(client.checkpoint_export("final-workspace"))
    except Exception as exc:  # noqa: BLE001 - keep whatever else we have
        (run_dir / "workspace.error").write_text(f"{type(exc).__name__}: {exc}\n")


def delete_spaces(spaces: CampaignSpaces) -> None:
    """Delete every Space of the provider; one that cannot be deleted is warned about."""
    for name in spaces.names():
        try:
            spaces.delete(name)
        except Exception as exc:  # noqa: BLE001 - the other Spaces still go
            print(f"warning: could not delete Space {name}: {exc}", file=sys.stderr)
