"""The docker backend: each Space is a container of the ``durable-space`` image (built from
the top-level ``Dockerfile`` by ``ci/build-images.sh`` or ``python -m chaos image build``)."""

from backends.docker.errors import DockerUnavailable
from backends.docker.provider import IMAGE, DockerSpace, DockerSpaces, Limits

__all__ = ["IMAGE", "DockerSpace", "DockerSpaces", "DockerUnavailable", "Limits"]
