"""Records as JSON, one way for every dataclass that is stored or sent: ``JsonRecord``.

A record's JSON is its fields, key for key in their order (what ``dataclasses.asdict``
gives), with nested records, tuples and lists encoded the same way; a field whose metadata
says ``OMIT_NONE`` is left out while it is None (a field added later, so that records
written before it encode to the same bytes). Reading follows the field types: a nested
record, a tuple or list of them, ``X | None``, and ``int``, ``float``, ``str`` and ``bool``
checked; a field missing from the JSON takes its
default (records written before it), and a key the record does not know is refused unless
the class says ``json_extra = "ignore"`` (records of older versions that had more). Every
refusal is a ``ValueError`` that names the record and the field.

A class with a stored form of its own (a list, a derived key) keeps its own ``to_json`` and
``from_json``; the codec calls them for its fields too.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any, ClassVar, Literal, Self

#: Field metadata: leave the field out of the JSON while it is None.
OMIT_NONE = {"omit_none": True}


class JsonRecord:
    """A dataclass mixin: ``to_json`` and ``from_json`` by the rules above."""

    #: What ``from_json`` does with a key the record has no field for.
    json_extra: ClassVar[Literal["refuse", "ignore"]] = "refuse"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]  # a dataclass's mixin
            value = getattr(self, f.name)
            if value is None and f.metadata.get("omit_none"):
                continue
            out[f.name] = _encode(value)
        return out

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Self:
        if not isinstance(raw, Mapping):
            raise ValueError(f"{cls.__name__}: expected a JSON object, got {raw!r:.100}")
        fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]  # a dataclass
        unknown = [k for k in raw if k not in fields]
        if unknown and cls.json_extra == "refuse":
            raise ValueError(f"{cls.__name__}: unknown field(s) {', '.join(map(repr, unknown))}"
                             f"; known: {', '.join(fields)}")
        hints = _hints(cls)
        args: dict[str, Any] = {}
        for name, f in fields.items():
            if name not in raw:
                if f.default is dataclasses.MISSING and \
                        f.default_factory is dataclasses.MISSING:
                    raise ValueError(f"{cls.__name__}: field {name!r} is missing")
                continue
            try:
                args[name] = _decode(hints[name], raw[name])
            except (TypeError, ValueError, KeyError) as exc:
                raise ValueError(f"{cls.__name__}.{name}: {exc}") from None
        try:
            return cls(**args)
        except TypeError as exc:
            raise ValueError(f"{cls.__name__}: {exc}") from None


_HINTS: dict[type, dict[str, Any]] = {}
#: What JSON may hold for a field of these types (a float field takes a whole number).
_PRIMITIVE: dict[Any, type | tuple[type, ...]] = {int: int, float: (int, float), str: str,
                                                   bool: bool}


def _hints(cls: type) -> dict[str, Any]:
    """``cls``'s field types, resolved once (its annotations are strings)."""
    if (hints := _HINTS.get(cls)) is None:
        hints = _HINTS[cls] = typing.get_type_hints(cls)
    return hints


def _encode(value: Any) -> Any:
    to_json = getattr(value, "to_json", None)
    if to_json is not None and dataclasses.is_dataclass(value):
        return to_json()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, tuple | list):
        return [_encode(v) for v in value]
    if isinstance(value, dict):
        return {k: _encode(v) for k, v in value.items()}
    return value


def _decode(hint: Any, value: Any) -> Any:
    origin = typing.get_origin(hint)
    if origin is typing.Union or origin is types.UnionType:
        if value is None:
            return None
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        return _decode(options[0], value) if len(options) == 1 else value
    if origin is tuple or origin is list:
        if not isinstance(value, list | tuple):
            raise ValueError(f"expected a list, got {value!r:.100}")
        args = typing.get_args(hint)
        if origin is tuple and args and args[-1] is not Ellipsis:  # tuple[int, str]: by place
            if len(args) != len(value):
                raise ValueError(f"expected {len(args)} items, got {value!r:.100}")
            return tuple(_decode(a, v) for a, v in zip(args, value, strict=True))
        items = [_decode(args[0] if args else Any, v) for v in value]
        return tuple(items) if origin is tuple else items
    if hint in _PRIMITIVE:
        ok = isinstance(value, _PRIMITIVE[hint]) and (hint is bool or not isinstance(value, bool))
        if not ok:
            raise ValueError(f"expected {hint.__name__}, got {value!r:.100}")
        return value
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        from_json = getattr(hint, "from_json", None)
        if from_json is not None:
            return from_json(value)
        if not isinstance(value, Mapping):
            raise ValueError(f"expected a JSON object, got {value!r:.100}")
        return hint(**value)
    return value
