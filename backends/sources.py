"""What a Space's machine carries of this tree: a copy of spacesd, in the Docker image and
in the microVM guest's disk, recorded by digest so that a provider never runs a copy made
from other sources than the tree it runs from (a campaign would then attack old code and
say nothing). The image carries the digest as its label ``durable.spacesd``
(``ci/build-images.sh`` asks this module for it); the guest's recipe hash includes it.

    python -m backends.sources      # prints spacesd's digest

Standard library only: ``ci/build-images.sh`` runs it before any environment is set up.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

SPACESD = Path(__file__).resolve().parents[1] / "spacesd"
#: The image label that holds ``spacesd_digest()`` of the sources it was built from.
IMAGE_LABEL = "durable.spacesd"


def tree_hash(paths: list[Path]) -> str:
    """SHA-256 over the files under ``paths`` (a file stands for itself), each by its path
    relative to its base's parent and its bytes, in path order; ``__pycache__`` left out."""
    h = hashlib.sha256()
    for base in paths:
        files = [base] if base.is_file() else sorted(
            p for p in base.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
        for p in files:
            h.update(str(p.relative_to(base.parent)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def spacesd_digest() -> str:
    """The digest of this tree's spacesd, as an image's ``IMAGE_LABEL`` records it."""
    return tree_hash([SPACESD])[:16]


if __name__ == "__main__":
    print(spacesd_digest())
