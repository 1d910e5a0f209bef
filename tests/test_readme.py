"""The README's example runs as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_examples_run(tmp_path: Path) -> None:
    """Every python block runs; the first (the runtime) and the virtual workspace's print
    what their comments say."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert len(blocks) >= 2, "the README has the runtime's and the virtual workspace's examples"
    outs = []
    for i, block in enumerate(blocks):
        script = tmp_path / f"example{i}.py"
        script.write_text(block)
        out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                             timeout=60, cwd=README.parent)
        assert out.returncode == 0, f"block {i}: {out.stderr}"
        outs.append(out.stdout)
    assert "hello, world" in outs[0]
    assert any("['count.txt', 'notes.txt']" in o for o in outs[1:])


def test_every_summary_example_has_the_keys_its_mode_prints() -> None:
    """A SUMMARY line in the README is output as the code prints it for its mode and
    backend: the same keys in the same order, none cut out."""
    from chaos.summary import printed_keys, summarize

    lines = [line.strip() for line in README.read_text().splitlines()
             if line.strip().startswith("SUMMARY mode=")]
    assert len(lines) >= 4, lines
    for line in lines:
        example = dict(part.split("=", 1) for part in line.split()[1:])
        made = summarize(mode=example["mode"], backend=example["backend"], seed_base=1,
                         records=[], seconds=0.0, durable_mode="checkpoint")
        assert list(example) == printed_keys(made), line
