"""Building the Space image: ``python -m chaos image build`` runs ``ci/build-images.sh``.

The build is a shell script, not Python, because its hard part is shell work that other
consumers share: ``ci/build-rootfs.sh`` (debootstrap) makes the base when no registry can
be reached, and the microVM guest disk will be made from the same root filesystem. This
module only finds the script in the source tree and runs it, so the CLI and CI build the
same way.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from backends.docker.provider import IMAGE

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "ci" / "build-images.sh"


def build(*, image: str = IMAGE, base: str | None = None) -> tuple[int, float]:
    """Run ``ci/build-images.sh`` (its progress goes to stderr) and return its exit status
    and the seconds it took. ``base`` forces the base image (``BASE``)."""
    if not SCRIPT.exists():
        raise FileNotFoundError(f"{SCRIPT} is missing: the image is built from a source "
                                "checkout (git clone the project, then run this again)")
    env = {**os.environ, "IMAGE": image}
    if base:
        env["BASE"] = base
    started = time.monotonic()
    code = subprocess.run(["bash", str(SCRIPT)], cwd=ROOT, env=env, check=False).returncode
    return code, time.monotonic() - started
