"""Checking request fields at the boundary, with messages that name the field and the type.

Each operation declares its fields as ``{name: Field}``; ``check`` returns the values
(defaults filled in) or raises ``BadRequest`` such as
``exec_start: field 'cwd' must be a string or null, got int (3)``. Unknown fields are
refused too, so that a misspelt option never silently does nothing.

Beyond the type, every value is checked for what the layers below cannot take: strings with
lone surrogates (not Unicode; they cannot be encoded for the file system, a command or a
hash), integers beyond ``protocol.MAX_INT`` (file offsets are 64-bit), NaN and infinities.
Fields that name workspace paths (``PATH_FIELDS``) may carry a name's bytes that are not
UTF-8 as surrogate escapes (``spacesd.paths``), and must fit the kernel's limits (a name of at
most ``MAX_NAME_BYTES``, a path of at most ``MAX_PATH_BYTES``), and a few fields have an
upper bound of their own (``BOUNDS``): the request gets a 400 naming the field, not a 500
from deep inside.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import paths, protocol
from .errors import BadRequest

_REQUIRED = object()


@dataclass(frozen=True)
class Field:
    """One request field: ``accepts(value)`` tells whether ``value`` has the right type,
    ``expected`` names that type in messages."""

    expected: str
    accepts: Callable[[Any], bool]
    default: Any = _REQUIRED

    def optional(self, default: Any = None) -> Field:
        """The same field, not required, ``null`` allowed, ``default`` when absent."""
        inner = self.accepts
        return Field(f"{self.expected} or null", lambda v: v is None or inner(v), default)

    def with_default(self, default: Any) -> Field:
        return Field(self.expected, self.accepts, default)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


STR = Field("a string", lambda v: isinstance(v, str))
INT = Field("an integer >= 0", lambda v: _is_int(v) and v >= 0)
NUM = Field("a number >= 0", lambda v: (_is_int(v) or isinstance(v, float)) and v >= 0)
BOOL = Field("a boolean", lambda v: isinstance(v, bool))
STR_LIST = Field(
    "a list of strings", lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v)
)
STR_MAP = Field(
    "an object of string values",
    lambda v: isinstance(v, dict) and all(isinstance(x, str) for x in v.values()),
)


_SURROGATE = re.compile("[\ud800-\udfff]")

#: Fields that are protocol paths, in every operation that has them.
PATH_FIELDS = frozenset({"path", "cwd", "target"})
#: Upper bounds of single fields: ``(op, field): (maximum, why)``.
BOUNDS: dict[tuple[str, str], tuple[int, str]] = {
    ("read_file", "limit"): (protocol.MAX_READ_LIMIT, "read a larger file in parts"),
}


def _has_surrogate(s: str) -> bool:
    return not s.isascii() and _SURROGATE.search(s) is not None


def _trouble(value: Any) -> str | None:
    """What makes ``value`` (already of the right type) unusable, or None."""
    if isinstance(value, str):
        return "contains a lone surrogate (not valid Unicode)" if _has_surrogate(value) else None
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return f"is too large (at most {protocol.MAX_INT})" if value > protocol.MAX_INT else None
    if isinstance(value, float):
        return None if math.isfinite(value) else "must be finite"
    if isinstance(value, list):
        return next((t for t in map(_trouble, value) if t), None)
    if isinstance(value, dict):
        for k, v in value.items():
            t = _trouble(k) or _trouble(v)
            if t:
                return t
    return None


def _path_trouble(value: str) -> str | None:
    """A path may carry the bytes of a name that is not UTF-8 as surrogate escapes
    (``paths``): only a surrogate that stands for no byte is refused."""
    bad = paths.bad_char(value)
    if bad is not None:
        return f"contains {bad}"
    raw = os.fsencode(value)
    if len(raw) > protocol.MAX_PATH_BYTES:
        return f"is longer than {protocol.MAX_PATH_BYTES} bytes"
    for part in raw.split(b"/"):
        if len(part) > protocol.MAX_NAME_BYTES:
            return (f"has a name longer than {protocol.MAX_NAME_BYTES} bytes "
                    f"({os.fsdecode(part[:40])!r}...)")
    return None


def check(op: str, raw: dict[str, Any], fields: dict[str, Field]) -> dict[str, Any]:
    """The fields of ``raw`` validated against ``fields``; ``raw`` must not hold others."""
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise BadRequest(
            f"{op}: unknown field(s) {', '.join(map(repr, unknown))}; "
            f"known: {', '.join(sorted(fields)) or 'none besides epoch'}"
        )
    out: dict[str, Any] = {}
    for name, spec in fields.items():
        if name not in raw:
            if spec.default is _REQUIRED:
                raise BadRequest(f"{op}: missing field {name!r} ({spec.expected})")
            out[name] = spec.default
            continue
        value = raw[name]
        if not spec.accepts(value):
            shown = repr(value)
            if len(shown) > 60:
                shown = shown[:57] + "..."
            raise BadRequest(
                f"{op}: field {name!r} must be {spec.expected}, "
                f"got {type(value).__name__} ({shown})"
            )
        if name in PATH_FIELDS and isinstance(value, str):
            trouble = _path_trouble(value)
        else:
            trouble = _trouble(value)
        bound = BOUNDS.get((op, name))
        if trouble is None and bound is not None and _is_int(value) and value > bound[0]:
            trouble = f"is over the limit of {bound[0]}; {bound[1]}"
        if trouble is not None:
            raise BadRequest(f"{op}: field {name!r} {trouble}")
        out[name] = value
    return out
