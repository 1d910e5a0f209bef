"""Spaces as QEMU ``microvm`` guests (``MicroVMSpaces``) with whole-machine checkpoints
(``SandboxSnapshots``); the guest is built once from Debian's packages (``artifacts``)."""

from .artifacts import Artifacts, ArtifactsUnavailable, ensure
from .provider import MicroVMSpaces, probe_accel
from .snapshots import SandboxSnapshots

__all__ = ["Artifacts", "ArtifactsUnavailable", "MicroVMSpaces", "SandboxSnapshots", "ensure",
           "probe_accel"]
