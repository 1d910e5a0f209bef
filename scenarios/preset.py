"""Campaign presets: how many steps a run has, the mix of step kinds, sizes and limits.

Presets are YAML files in this directory (``default.yaml``, ``auto.yaml``, ...). Loading
checks every field and says what is wrong and how to fix it, so a typo in a preset is a
one-line error (exit 254), not a confusing campaign.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

STEP_KINDS = ("write", "edit", "append", "long", "background", "many_files", "never_tool",
              "safe_tool", "fail", "write_fail", "big_output", "rm", "mv", "mkdir", "symlink",
              "chmod", "binary", "large", "sums", "detached", "synced_append", "large_loop",
              "late_print",
              # the shapes real programs leave (git, venvs, tar, make): see steps.py
              "empty_dir", "hardlink", "fifo", "abs_symlink", "odd_name", "sparse", "dated",
              "setid")
PRESET_DIR = Path(__file__).parent
#: The step kinds a virtual workspace's shell (``durable.virtual.shell``: pure Python, no
#: processes) does not run as bash does, each with what it lacks; a scripted agent drawing
#: any of them there would fail runs that did nothing wrong. Found by running a campaign of
#: each kind on ``--backend virtual``; docs/workloads.md has the workspace side.
VIRTUAL_SHELL_LACKS: dict[str, str] = {
    "background": "background jobs (it runs them to their end in the foreground)",
    "detached": "setsid", "big_output": "seq -f", "symlink": "ln -n",
    "abs_symlink": "ln -n", "binary": "printf escapes above \\177", "large": "yes",
    "synced_append": "sync", "late_print": "seq -f", "hardlink": "hard links (ln copies)",
    "fifo": "mkfifo",
    "odd_name": "newlines and backslashes in names", "sparse": "truncate and dd",
    "dated": "touch -d (it keeps no mtime)"}


class PresetError(ValueError):
    """A preset file is missing or malformed. The message names the field and what it
    expects; fix the YAML (see scenarios/default.yaml for every field)."""


#: The most steps one run may have: a scripted session of ten thousand tool calls is already
#: far beyond any agent's; more is a typo that would run for hours.
MAX_STEPS = 10_000


@dataclass(frozen=True)
class Preset:
    name: str
    steps: int = 10
    mix: dict[str, int] = field(default_factory=lambda: {"write": 3, "edit": 2, "append": 3,
                                                         "long": 1, "never_tool": 1})
    #: Content size range of written files, bytes.
    file_size: tuple[int, int] = (64, 2048)
    long_seconds: float = 1.5
    many_files: int = 40
    #: Lines a ``big_output`` command prints (about 20 bytes each: beyond the 64 KiB tail).
    big_output_lines: int = 4000
    #: Size of the file a ``large`` command writes, bytes.
    large_bytes: int = 1_200_000
    initial_files: int = 3
    max_files: int = 1000
    max_bytes: int = 16 * 1024 * 1024
    #: Probability that the scripted model issues an interrupted step again.
    reissue: float = 0.5
    #: A fixed order of step kinds (cycled); when set, ``mix`` is not drawn from.
    sequence: tuple[str, ...] = ()
    #: Probability that a run's agent forks its conversation (``Scenario.fork_after``).
    forks: float = 0.0

    @property
    def kinds(self) -> set[str]:
        """Every step kind this preset can draw."""
        return {k for k, weight in self.mix.items() if weight > 0} | set(self.sequence)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "steps": self.steps, "mix": dict(self.mix),
                "file_size": list(self.file_size), "long_seconds": self.long_seconds,
                "many_files": self.many_files, "big_output_lines": self.big_output_lines,
                "large_bytes": self.large_bytes, "initial_files": self.initial_files,
                "max_files": self.max_files, "max_bytes": self.max_bytes,
                "reissue": self.reissue, "sequence": list(self.sequence),
                "forks": self.forks}


def _expect(raw: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    value = raw[key]
    if isinstance(value, bool) or not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise PresetError(f"{where}: Expected {names} for {key!r} but got {key}={value!r} "
                          f"(type={type(value).__name__})")
    return value


def parse(raw: Any, where: str) -> Preset:
    if not isinstance(raw, dict):
        raise PresetError(f"{where}: a preset is a YAML mapping, got {type(raw).__name__}")
    known = set(Preset.__dataclass_fields__)
    unknown = sorted(set(raw) - known)
    if unknown:
        raise PresetError(f"{where}: unknown field(s) {unknown}; known: {sorted(known)}")
    name = raw.get("name", Path(where).stem)
    if not isinstance(name, str) or not name:
        raise PresetError(f"{where}: name is a non-empty string, got {name!r}")
    kw: dict[str, Any] = {"name": name}
    for key in ("steps", "many_files", "big_output_lines", "large_bytes", "initial_files",
                "max_files", "max_bytes"):
        if key in raw:
            kw[key] = _expect(raw, key, int, where)
            if kw[key] < 0 or (key == "steps" and kw[key] < 1):
                raise PresetError(f"{where}: {key} must be positive, got {kw[key]}")
    if kw.get("steps", 0) > MAX_STEPS:
        raise PresetError(f"{where}: steps is at most {MAX_STEPS}, got {kw['steps']}")
    if kw.get("big_output_lines", 0) > 99_999:
        raise PresetError(f"{where}: big_output_lines is at most 99999 (the lines are numbered "
                          f"with six digits), got {kw['big_output_lines']}")
    for key in ("long_seconds", "reissue", "forks"):
        if key in raw:
            kw[key] = float(_expect(raw, key, (int, float), where))
            if not math.isfinite(kw[key]) or kw[key] < 0:
                raise PresetError(f"{where}: {key} must be a finite number >= 0, got "
                                  f"{raw[key]!r}")
    for key in ("reissue", "forks"):
        if key in kw and not 0 <= kw[key] <= 1:
            raise PresetError(f"{where}: {key} is a probability in [0, 1], got {kw[key]}")
    if "file_size" in raw:
        fs = raw["file_size"]
        if (not isinstance(fs, list) or len(fs) != 2 or not all(isinstance(x, int) for x in fs)
                or not 1 <= fs[0] <= fs[1]):
            raise PresetError(f"{where}: file_size is [min, max] bytes with 1 <= min <= max, "
                              f"got {fs!r}")
        kw["file_size"] = (fs[0], fs[1])
    if "mix" in raw:
        mix = _expect(raw, "mix", dict, where)
        bad = sorted(set(mix) - set(STEP_KINDS))
        if bad:
            raise PresetError(f"{where}: unknown step kind(s) {bad} in mix; known: "
                              f"{list(STEP_KINDS)}")
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in mix.values()):
            raise PresetError(f"{where}: mix weights are non-negative integers, got {mix!r}")
        if sum(mix.values()) == 0:
            raise PresetError(f"{where}: mix has no step kind with a positive weight")
        kw["mix"] = dict(mix)
    if "sequence" in raw:
        seq = raw["sequence"]
        if not isinstance(seq, list) or not seq or not all(k in STEP_KINDS for k in seq):
            raise PresetError(f"{where}: sequence is a non-empty list of step kinds from "
                              f"{list(STEP_KINDS)}, got {seq!r}")
        kw["sequence"] = tuple(seq)
    return Preset(**kw)


def load(name_or_path: str) -> Preset:
    """A preset by name (``default`` → scenarios/default.yaml) or by path."""
    path = Path(name_or_path)
    if not path.suffix:
        path = PRESET_DIR / f"{name_or_path}.yaml"
    if not path.exists():
        names = sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))
        raise PresetError(f"no preset {name_or_path!r} (looked for {path}); known: {names}")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise PresetError(f"{path}: not UTF-8 text ({exc}); save the preset as UTF-8") from None
    except yaml.YAMLError as exc:
        raise PresetError(f"{path}: not valid YAML: {exc}") from None
    except OSError as exc:
        raise PresetError(f"{path}: cannot be read ({exc.strerror})") from None
    return parse(raw, str(path))
