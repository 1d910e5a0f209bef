"""The docker backend as campaigns see it (``backends.descriptor``); importable without the
Docker SDK, whose absence ``make`` explains."""

from __future__ import annotations

import hashlib
import re
import sys
from pathlib import Path
from typing import Any

from backends.descriptor import BackendDescriptor, BackendUnavailable, ProviderOptions


def _make(run_dir: Path, options: ProviderOptions) -> Any:
    try:
        from backends.docker import DockerSpaces, DockerUnavailable
    except ImportError as exc:
        raise BackendUnavailable(
            f"the docker backend is not installed here ({exc}); install the project "
            "with its docker extra and build the image (ci/build-images.sh)") from None
    # The scope must tell this run from every other on the engine, including the
    # same-numbered run of a campaign running beside this one: name plus path digest.
    digest = hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:10]
    readable = re.sub(r"[^A-Za-z0-9-]", "-", run_dir.name).strip("-")[:40] or "run"
    try:
        return DockerSpaces(label_scope=f"{readable}-{digest}", failpoints=options.failpoints,
                            request_timeout=options.request_timeout, via=options.via,
                            work_disk=options.disks.get("work"), disk_dir=run_dir / "disks")
    except DockerUnavailable as exc:
        raise BackendUnavailable(str(exc)) from None


def _clean(results: Path) -> int:
    """Every campaign's containers on the engine, running or not (found by their labels);
    none where there is no SDK or no engine (said on stderr)."""
    try:
        from backends.docker import DockerSpaces, DockerUnavailable
    except ImportError:  # no docker SDK here: no docker Spaces either
        return 0
    try:
        return DockerSpaces.clean_all()
    except DockerUnavailable as exc:
        print(f"clean: docker Spaces not cleaned: {exc}", file=sys.stderr)
        return 0


BACKEND = BackendDescriptor("docker", _make, spaces_in_run_dir=False, shared_failpoints=True,
                            clean=_clean, own_disks=frozenset({"work"}))
