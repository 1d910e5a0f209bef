"""A small JSON-schema checker for tool inputs.

Tools declare their input as JSON schema; a model's arguments are checked before the call's
intent is committed, so a malformed call never runs and the model gets an error result that
names the field. Supported: ``type`` (object, array, string, integer, number, boolean,
null, or a list of them), ``properties``, ``required``, ``additionalProperties: false``,
``items``, ``enum``, ``minimum``/``maximum``, ``minLength``. That is what tool schemas use;
anything else is ignored rather than guessed at.
"""

from __future__ import annotations

from typing import Any

from .errors import ToolInputError

_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "null": (type(None),),
}


def _type_ok(value: Any, name: str) -> bool:
    if name in ("integer", "number") and isinstance(value, bool):
        return False
    return isinstance(value, _TYPES[name])


def check(value: Any, schema: dict[str, Any], where: str = "arguments") -> None:
    """Raise ``ToolInputError`` naming the first place ``value`` breaks ``schema``."""
    expected = schema.get("type")
    if expected is not None:
        names = expected if isinstance(expected, list) else [expected]
        if not any(_type_ok(value, n) for n in names):
            raise ToolInputError(
                f"Expected {' or '.join(names)} but got {where}={value!r} "
                f"(type={type(value).__name__})"
            )
    if "enum" in schema and value not in schema["enum"]:
        raise ToolInputError(f"{where}={value!r} is not one of {schema['enum']!r}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            raise ToolInputError(f"{where}={value!r} is below the minimum {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            raise ToolInputError(f"{where}={value!r} is above the maximum {schema['maximum']}")
    if isinstance(value, str) and len(value) < schema.get("minLength", 0):
        raise ToolInputError(f"{where} must have at least {schema['minLength']} characters")
    if isinstance(value, dict):
        props: dict[str, Any] = schema.get("properties", {})
        for name in schema.get("required", []):
            if name not in value:
                raise ToolInputError(f"{where} is missing the required field {name!r}")
        if schema.get("additionalProperties") is False:
            extra = sorted(set(value) - set(props))
            if extra:
                raise ToolInputError(
                    f"{where} has unexpected field(s) {extra}; allowed: {sorted(props)}"
                )
        for name, sub in props.items():
            if name in value:
                check(value[name], sub, f"{where}.{name}")
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            check(item, schema["items"], f"{where}[{i}]")
