"""The README's example runs as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_example_runs(tmp_path: Path) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert blocks, "the README has a python example"
    script = tmp_path / "example.py"
    script.write_text(blocks[0])
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=60, cwd=README.parent)
    assert out.returncode == 0, out.stderr
    assert "hello, world" in out.stdout
