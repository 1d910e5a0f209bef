"""The docker backend: each Space is a container of the ``durable-space`` image (built from
the top-level ``Dockerfile`` by ``ci/build-images.sh`` or ``python -m chaos image build``).

The provider needs the Docker SDK (the project's docker extra); it is imported when first
asked for, so that ``backends.docker.descriptor`` and the errors load without it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from backends.docker.errors import DockerUnavailable

if TYPE_CHECKING:
    from backends.docker.provider import IMAGE, DockerSpace, DockerSpaces, Limits

__all__ = ["IMAGE", "DockerSpace", "DockerSpaces", "DockerUnavailable", "Limits"]


def __getattr__(name: str) -> Any:
    if name in ("IMAGE", "DockerSpace", "DockerSpaces", "Limits"):
        from backends.docker import provider

        return getattr(provider, name)
    raise AttributeError(f"module 'backends.docker' has no attribute {name!r}")
