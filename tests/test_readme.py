"""The README and docs/ say what the code does: their examples run as written, their
SUMMARY lines are what the code prints, their links lead somewhere, and docs/architecture.md
holds the recovery cells, the failpoints and the SUMMARY keys the code has."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
ARCHITECTURE = DOCS / "architecture.md"
#: The README and every page of docs/.
PAGES = [README, *sorted(DOCS.glob("*.md"))]
#: Documents that are not in the repository (the design notes the docs replaced).
OUTSIDE_DOCS = tuple(f"{name}.md" for name in ("DESIGN", "STYLE"))


def python_blocks(page: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", page.read_text(), re.S | re.M)


def run_block(block: str, script: Path) -> str:
    script.write_text(block)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=60, cwd=ROOT)
    assert out.returncode == 0, f"{script.name}: {out.stderr}"
    return out.stdout


def test_the_docs_are_there() -> None:
    names = {p.name for p in PAGES}
    assert {"README.md", "architecture.md", "campaigns.md", "runtime.md",
            "virtual.md"} <= names, names


def test_every_python_block_runs(tmp_path: Path) -> None:
    """Every python block of the README and of docs/*.md runs; the runtime's example and the
    virtual workspace's print what their comments say."""
    outs: dict[str, list[str]] = {}
    for page in PAGES:
        for i, block in enumerate(python_blocks(page)):
            outs.setdefault(page.name, []).append(
                run_block(block, tmp_path / f"{page.stem}_{i}.py"))
    assert sum(len(o) for o in outs.values()) >= 2, outs
    assert any("hello, world" in o for o in outs.get("runtime.md", [])), outs
    assert any("['count.txt', 'notes.txt']" in o for o in outs.get("virtual.md", [])), outs


def test_every_workload_example_is_a_workload() -> None:
    """A YAML block of the README or docs/ that lists ``calls:`` is a workload file the
    campaign takes as written (the README's and docs/workloads.md's examples)."""
    import yaml

    from scenarios.workload import parse

    blocks = [(page.name, block) for page in PAGES
              for block in re.findall(r"^```yaml\n(.*?)^```", page.read_text(), re.S | re.M)
              if "\ncalls:" in block]
    assert {name for name, _ in blocks} >= {"README.md", "workloads.md"}, blocks
    for name, block in blocks:
        workload = parse(yaml.safe_load(block), name)
        assert workload.calls, (name, block)


def test_every_summary_example_has_the_keys_its_mode_prints() -> None:
    """A SUMMARY line in the README or docs/ is output as the code prints it for its mode and
    backend: the same keys in the same order, none cut out."""
    from chaos.campaign.summary import printed_keys, summarize

    lines = [(page.name, line.strip()) for page in PAGES
             for line in page.read_text().splitlines()
             if line.strip().startswith("SUMMARY mode=")]
    assert len(lines) >= 4, lines
    assert any(name == "README.md" for name, _line in lines), "the README shows a SUMMARY"
    for name, line in lines:
        example = dict(part.split("=", 1) for part in line.split()[1:])
        made = summarize(mode=example["mode"], backend=example["backend"], seed_base=1,
                         records=[], seconds=0.0, durable_mode="checkpoint")
        assert list(example) == printed_keys(made), f"{name}: {line}"


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    return {_slug(m) for m in re.findall(r"^#{1,6} (.+)$", text, re.M)}


def _links(page: Path) -> list[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    text = re.sub(r"`[^`\n]*`", "", text)
    return re.findall(r"\]\(([^)\s]+)\)", text)


def test_relative_links_lead_to_files_and_headings() -> None:
    checked = 0
    for page in PAGES:
        for link in _links(page):
            if re.match(r"[a-z]+:", link):
                continue  # http(s):, mailto:
            path, _, anchor = link.partition("#")
            target = (page.parent / path).resolve() if path else page
            assert target.is_file(), f"{page.name}: {link} leads to no file"
            assert ROOT in target.parents, f"{page.name}: {link} leaves the repository"
            if anchor and target.suffix == ".md":
                assert anchor in _anchors(target), f"{page.name}: {link}: no such heading"
            checked += 1
    assert checked >= 20, checked


def test_readme_is_short_and_names_real_paths() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 150
    assert ARCHITECTURE.is_file()
    assert "./ci/campaign.sh" in text and "./ci/test.sh" in text
    for code in (0, 1, 2, 130, 254, 255):
        assert re.search(rf"^- `{code}`: ", text, re.M), code
    paths = set(re.findall(r"`((?:durable|spacesd|backends|chaos|scenarios|reports|tests|ci)"
                           r"/[\w./<>-]*)`", text))
    assert len(paths) >= 15, paths
    for path in paths:
        if "<" not in path:
            assert (ROOT / path).exists(), f"README names {path}, which does not exist"
    for page in PAGES[1:]:
        assert f"(docs/{page.name})" in text, f"the README links no docs/{page.name}"


def test_no_file_refers_to_documents_outside_the_repository() -> None:
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                           check=True).stdout.decode().split("\0")
    files += [str(p.relative_to(ROOT)) for p in PAGES]  # new pages, before they are added
    seen = 0
    for name in set(filter(None, files)):
        path = ROOT / name
        if not path.is_file():
            continue  # deleted in the work tree
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue  # not a text file
        seen += 1
        for doc in OUTSIDE_DOCS:
            assert doc not in text, f"{name} refers to {doc}, which is not in the repository"
    assert seen >= 100, seen


def _section(text: str, heading: str) -> str:
    start = text.index(f"\n{heading}\n")
    end = re.search(r"^#{1,3} ", text[start + len(heading) + 2:], re.M)
    return text[start:start + len(heading) + 2 + end.start()] if end else text[start:]


def test_architecture_has_the_recovery_cells_of_the_code() -> None:
    from chaos.campaign.coverage import AUTO_ONLY, REACHABLE_CELLS, table_cells

    cells = _section(ARCHITECTURE.read_text(), "### Cells")
    rows = re.findall(r"^\| `(\w+)` \| `(\w+)` \| `(\w+)` \| `(\w+)` \| (.+) \|$", cells, re.M)
    assert {r[:4] for r in rows} == set(REACHABLE_CELLS)
    assert len(rows) == len(REACHABLE_CELLS)
    assert {r[:4] for r in rows if "only" in r[4]} == set(AUTO_ONLY)
    assert f"The table can produce {len(table_cells())}" in cells
    assert f"The other {len(table_cells()) - len(REACHABLE_CELLS)} are unreachable" in cells


def test_architecture_lists_every_failpoint_and_summary_key() -> None:
    from chaos.campaign.summary import KEYS
    from durable.failpoints import POINTS as DRIVER_POINTS
    from spacesd.failpoints import POINTS as SPACE_POINTS

    text = ARCHITECTURE.read_text()
    listed = re.findall(r"^\| `([\w.]+)` \| `([\w/]+\.py)`", _section(text, "## Failpoints"),
                        re.M)
    assert [p for p, _f in listed] == [*DRIVER_POINTS, *SPACE_POINTS]
    for point, module in listed:
        source = (ROOT / module).read_text()
        assert f'"{point}"' in source, f"{point} is not reported in {module}"
    assert any(line.split() == list(KEYS) for line in text.splitlines()), "SUMMARY keys"
