"""G1 state: the workspace equals the state the committed log implies.

Content, full permission bits, symlinks and their targets, deletions and renames: one hash
(``spacesd.protocol.workspace_hash``) over the Space's final scan and over the implied
model. In transactional mode (as the conversation ended), the log's own image of the
workspace must equal it too, unless the image was marked stale."""

from __future__ import annotations

from typing import TYPE_CHECKING

from spacesd.protocol import workspace_hash

if TYPE_CHECKING:
    from . import CheckInput


def check(inp: CheckInput) -> list[str]:
    obs = inp.obs
    errors = list(inp.implied.strangers)
    want = inp.implied.workspace.hash()
    got = workspace_hash(obs.workspace)
    if want != got:
        exp_rows = {r[0]: r for r in inp.implied.workspace.rows()}
        obs_rows = {r[0]: tuple(r) for r in obs.workspace if r[1] in ("file", "symlink")}
        diffs = sorted(p for p in set(exp_rows) | set(obs_rows)
                       if exp_rows.get(p) != obs_rows.get(p))
        detail = "; ".join(f"{p}: Space {_show(obs_rows.get(p))}, log {_show(exp_rows.get(p))}"
                           for p in diffs[:5])
        errors.append(f"workspace hash {got[:12]} != log-implied {want[:12]}; {len(diffs)} "
                      f"path(s) differ: {detail}{' ...' if len(diffs) > 5 else ''}")
    if obs.end_mode == "transactional" and not obs.image_stale and obs.image_hash != got:
        errors.append(f"the log's image {str(obs.image_hash)[:12]} != workspace {got[:12]}")
    return errors


def _show(row: tuple | None) -> str:
    if row is None:
        return "absent"
    _path, kind, mode, ident = row
    if kind == "symlink":
        return f"symlink -> {ident}"
    return f"file {int(mode):o} {str(ident)[:10]}"
