"""Errors of the docker backend."""

from __future__ import annotations

from durable.errors import SpaceUnavailable


class DockerUnavailable(SpaceUnavailable):
    """No Docker engine answers, or the Space image is missing.

    Raised when ``DockerSpaces`` is constructed without an engine (start ``dockerd``, or
    point ``DOCKER_HOST`` at one; ``ci/docker.sh`` shows what works on a bare machine) and by
    ``create`` when the image is not built (run ``python -m chaos image build`` or
    ``ci/build-images.sh``). The message names which, with the engine's own error."""
