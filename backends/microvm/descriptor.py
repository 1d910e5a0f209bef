"""The microvm backend as campaigns see it (``backends.descriptor``)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from backends.descriptor import (
    BackendDescriptor,
    BackendUnavailable,
    ProviderOptions,
    delete_spaces_under,
)


def _make(run_dir: Path, options: ProviderOptions) -> Any:
    from backends.microvm import ArtifactsUnavailable, MicroVMSpaces, ensure

    if shutil.which("qemu-system-x86_64") is None or shutil.which("qemu-img") is None:
        raise BackendUnavailable("the microvm backend needs QEMU: apt-get install "
                                 "qemu-system-x86 qemu-utils busybox-static")
    try:
        ensure()  # built once (as root); a clear reason here when it cannot be
    except ArtifactsUnavailable as exc:
        raise BackendUnavailable(f"the microvm backend cannot run here: {exc}") from None
    return MicroVMSpaces(run_dir / "spaces", failpoints=options.failpoints,
                         request_timeout=options.request_timeout, via=options.via)


def _clean(results: Path) -> int:
    """Their QEMUs killed by pid and start time, their directories removed."""
    from backends.microvm import MicroVMSpaces

    return delete_spaces_under(results, MicroVMSpaces)


#: ``own_disks``: its workspace's disk is the machine's one disk, which the guest agent fills.
BACKEND = BackendDescriptor("microvm", _make, machines=True, clean=_clean,
                            own_disks=frozenset({"work"}))
