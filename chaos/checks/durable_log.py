"""``G7`` durable: every commit the drivers' log had returned when their host lost power is
in the log after it (``cut_host_power``), as it was. A SIGKILL cannot show a log that does
not sync its commits (the page cache keeps them); a power cut can, and a commit that
vanishes is an acknowledged write lost: the agent acted on a result the log no longer has,
and the next driver runs the call again. Holds trivially in a run with no power cut."""

from __future__ import annotations

from typing import TYPE_CHECKING

from chaos.checks.model import Undecided

if TYPE_CHECKING:
    from chaos.checks.model import CheckInput

#: The most lost commits one error lists.
SHOWN = 5


def check(inp: CheckInput) -> list[str]:
    errors: list[str] = []
    for cut in inp.obs.power_cuts:
        if cut.get("before_error"):
            raise Undecided(f"the log before the host's power cut ({cut['fault']}) could not "
                            f"be read, so what it had committed is unknown: "
                            f"{cut['before_error']}")
        if cut.get("after_error"):
            errors.append(f"the host's power cut ({cut['fault']}) left a log that cannot be "
                          f"read ({cut['after_error']}); it held {len(cut['before'])} "
                          "commits that had returned")
            continue
        kept = set(cut["after"])
        lost = [c for c in cut["before"] if c not in kept]
        if lost:
            more = f" (and {len(lost) - SHOWN} more)" if len(lost) > SHOWN else ""
            errors.append(f"the host's power cut ({cut['fault']}) lost {len(lost)} of "
                          f"{len(cut['before'])} commits that had returned: "
                          f"{'; '.join(lost[:SHOWN])}{more}")
    return errors
