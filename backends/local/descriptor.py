"""The local backend as campaigns see it (``backends.descriptor``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from backends.descriptor import BackendDescriptor, ProviderOptions, delete_spaces_under


def _make(run_dir: Path, options: ProviderOptions) -> Any:
    from backends.local import LocalSpaces, daemon_start

    spaces = LocalSpaces(run_dir / "spaces", failpoints=options.failpoints,
                         request_timeout=options.request_timeout, via=options.via,
                         state_disk=options.disks.get("state"),
                         work_disk=options.disks.get("work"))
    if options.fork_daemons and (server := daemon_start.fork_server()) is not None:
        server.serve(spaces.base_dir)
    return spaces


def _clean(results: Path) -> int:
    from backends.local import LocalSpaces

    return delete_spaces_under(results, LocalSpaces)


BACKEND = BackendDescriptor("local", _make, own_disks=frozenset({"state", "work"}),
                            clean=_clean)
