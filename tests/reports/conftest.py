"""What the report tests share: headless Chromium, which renders an HTML report (Debian's
``chromium``; ``.ci/run`` installs it)."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")


def dump_dom(page: Path, profile: Path) -> str:
    """The DOM of ``page`` after headless Chromium loaded it; the browser's whole process
    group is killed if it hangs."""
    argv = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--no-first-run", f"--user-data-dir={profile}", "--dump-dom", page.as_uri()]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            stdin=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == 0, f"chromium exited {proc.returncode}"
    return out


@pytest.fixture
def chromium() -> Iterator[Path]:
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is absent: install Debian's chromium "
                    "(apt-get install -y chromium) to render the report")
    yield CHROMIUM
