"""G1 state: the workspace equals the state the committed log implies.

The whole workspace state (``spacesd.protocol.ScanEntry``: names, kinds, every mode bit,
contents, link targets, hardlink groups, sparse extents, directories, FIFOs) under one hash
(``spacesd.protocol.workspace_hash``) over the Space's final scan and over the implied
model; mtimes wherever the model decides them (``protocol.times_as``). In transactional
mode (as the conversation ended), the log's own image of the workspace must equal it too,
mtimes included, unless the image was marked stale. Paths a command cut short by a full
disk left unsure (``chaos.checks.implied``) are as the Space has them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from spacesd.protocol import ScanEntry, times_as, workspace_hash

if TYPE_CHECKING:
    from chaos.checks.model import CheckInput


def check(inp: CheckInput) -> list[str]:
    obs = inp.obs
    errors = list(inp.implied.strangers)
    expected, observed = inp.implied.state, obs.workspace
    if inp.scenario.workload is not None:
        expected = inp.scenario.workload.comparable(expected)
        observed = inp.scenario.workload.comparable(observed)
    if inp.implied.workspace.unsure:  # a full disk cut a command short: the Space's word
        unsure = inp.implied.workspace.unsure
        expected = [e for e in expected if e.path not in unsure]
        observed = [e for e in observed if e.path not in unsure]
    if obs.dirs_implied:
        parents = {e.path.rpartition("/")[0] for e in expected if e.kind != "dir"}
        implied = {p.rsplit("/", i)[0] for p in parents if p for i in range(p.count("/") + 1)}
        expected = [e for e in expected if e.kind != "dir" or e.path in implied]
    observed = times_as(observed, expected)
    want, got = workspace_hash(expected), workspace_hash(observed)
    if want != got:
        errors.append(state_difference(observed, expected, "Space", "log"))
    actual = workspace_hash(obs.workspace)
    if obs.end_mode == "transactional" and not obs.image_stale and obs.image_hash != actual:
        errors.append(f"the log's image {str(obs.image_hash)[:12]} != workspace {actual[:12]}")
    return errors


def state_difference(got: list[ScanEntry], want: list[ScanEntry], got_name: str,
                     want_name: str) -> str:
    """What differs between two workspace states, path by path (the first five)."""
    a = {e.path: e.state() for e in got}
    b = {e.path: e.state() for e in want}
    diffs = sorted(p for p in set(a) | set(b) if a.get(p) != b.get(p))
    detail = "; ".join(f"{p!r}: {got_name} {_show(a.get(p))}, {want_name} {_show(b.get(p))}"
                       for p in diffs[:5])
    return (f"workspace hash {workspace_hash(got)[:12]} != {want_name}-implied "
            f"{workspace_hash(want)[:12]}; {len(diffs)} path(s) differ: {detail}"
            f"{' ...' if len(diffs) > 5 else ''}")


def _show(state: list[Any] | None) -> str:
    if state is None:
        return "absent"
    _path, kind, mode, ident, link, extents, mtime = state
    what = {"symlink": f"symlink -> {ident}", "file": f"file {mode:o} {ident[:10]}",
            "dir": f"dir {mode:o}", "fifo": f"fifo {mode:o}"}[kind]
    extra = [f"hardlink of {link!r}" if link else "", f"extents {extents}" if extents else "",
             f"mtime {mtime}" if mtime is not None else ""]
    return " ".join([what, *filter(None, extra)])
