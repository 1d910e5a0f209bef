"""What a campaign mode's own code (``chaos.modes.stale_kinds``, ``chaos.modes.redrive``,
``chaos.modes.machine_check``) reads and changes of its run: ``chaos.run.runner.Run`` is one. The
modes see the run through this protocol, so none of them imports the runner that calls
them."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from chaos.faults.host_power import HostDisk
from chaos.faults.link_proxy import LinkProxy, LinkTable
from chaos.faults.plans import FaultPlan
from chaos.faults.schedule import FaultSchedule
from chaos.modes.holds import Holds
from chaos.run.attempts import AttemptScope
from chaos.run.launch import OtherSession
from chaos.run.processes import Owned
from chaos.run.spec import RunSpec
from chaos.run.state import RunState
from chaos.space_providers import CampaignSpaces
from scenarios import Preset, Scenario


class RunContext(Protocol):
    spec: RunSpec
    #: The run's directory (its log, its drivers' state, its saved ledgers).
    dir: Path
    scenario: Scenario
    preset: Preset
    plan: FaultPlan
    state: RunState
    scope: AttemptScope
    holds: Holds
    schedule: FaultSchedule
    #: The run's session, its root Space, and the Spaces provider (None: virtual).
    session: str
    space: str
    spaces: CampaignSpaces | None
    #: The newest epoch launched for the run's session.
    epoch: int
    #: Redrive mode: what the coordinator did (``chaos.modes.redrive.Redrive.facts``).
    redrive: dict[str, Any] | None
    #: Stale mode: what went wrong with another driver or session, the keys another log
    #: of this session started in the run's Space, and when the run may be observed.
    stale_error: str | None
    foreign_keys: list[str]
    settle_at: float
    #: The link between the faulted drivers and the Space, when the plan cuts it.
    link: LinkProxy | None
    #: The drivers' log's disk, when the plan cuts the host's power (``cut_host_power``).
    host_disk: HostDisk | None
    links: LinkTable

    def space_of(self, session: str, conversation: int = ...) -> str:
        """The Space of ``session``'s ``conversation``."""

    def attempts(self, failpoints: str) -> int | None:
        """Drivers with growing epochs under the plan's faults, until one finishes or fails
        for good; the last one's exit code (the standard modes' phase 2)."""

    def request_timeout(self, *, faulted: bool) -> float | None:
        """A driver's Space request timeout (``faulted``: one the plan's held faults meet)."""

    def launch(self, attempt: int, failpoints: str | None, *, heartbeat: float = ...,
               other: OtherSession | None = ...) -> Owned:
        """A driver of the run's session (or of ``other``), launched in the run's scope."""

    def await_driver(self, driver: Owned, attempt: int, *, epoch: int | None = ...,
                     other: OtherSession | None = ...) -> int:
        """``driver``'s exit code, its end recorded in the run's history."""

    def note_launch(self) -> None:
        """A driver was launched by someone else (the coordinator): faults fired from now
        on are its."""
