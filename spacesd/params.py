"""Checking request fields at the boundary, with messages that name the field and the type.

Each operation declares its fields as ``{name: Field}``; ``check`` returns the values
(defaults filled in) or raises ``BadRequest`` such as
``exec_start: field 'cwd' must be a string or null, got int (3)``. Unknown fields are
refused too, so that a misspelt option never silently does nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

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
        out[name] = value
    return out
