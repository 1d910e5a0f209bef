"""Typed documents: small JSON values kept in the log beside the entries.

A document is defined once in code with ``define_doc`` and then read and written per
conversation. Its definition carries a version: a stored value written by an older version
is passed through ``migrate(value, from_version)`` when read; one written by a newer version
cannot be understood and raises ``DocVersionError`` rather than being misread.

``history="rewindable"`` keeps every write so the value can be read ``as_of`` any entry
(the Space adapter reads its state as of a fork entry this way); ``"latest"`` keeps only the
newest. ``fork`` says what a forked conversation starts with: the initial value, the
parent's current value, or the parent's value as of the fork entry.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from .errors import DocError, DocTooLarge, DocVersionError, UnknownDoc
from .storage.records import DOC_MAX_BYTES, encode_json

ForkRule = Literal["initial", "current", "as_of"]
HistoryRule = Literal["latest", "rewindable"]
Migrate = Callable[[Any, int], Any]


@dataclass(frozen=True)
class Doc:
    kind: str
    version: int
    initial: Any
    migrate: Migrate | None = None
    history: HistoryRule = "latest"
    fork: ForkRule = "initial"

    def initial_value(self) -> Any:
        return copy.deepcopy(self.initial)

    def decode(self, value: Any, stored_version: int) -> Any:
        """The stored ``value`` brought up to this definition's version."""
        if stored_version == self.version:
            return value
        if stored_version > self.version:
            raise DocVersionError(
                f"document {self.kind!r} was stored by version {stored_version} but this code "
                f"defines version {self.version}; upgrade the code that reads it"
            )
        if self.migrate is None:
            raise DocVersionError(
                f"document {self.kind!r} is stored at version {stored_version}, older than "
                f"{self.version}, and its definition has no migrate; add "
                "migrate=(value, from_version) -> value to define_doc"
            )
        return self.migrate(value, stored_version)

    def encode(self, value: Any) -> str:
        """The JSON text of ``value``; raises ``DocTooLarge`` / ``DocError`` when unusable."""
        try:
            text = encode_json(value)
        except (TypeError, ValueError) as exc:
            raise DocError(
                f"document {self.kind!r} value is not JSON ({exc}); store only dicts, lists, "
                "strings, numbers, booleans and None"
            ) from None
        size = len(text.encode("utf-8"))
        if size > DOC_MAX_BYTES:
            raise DocTooLarge(
                f"document {self.kind!r} encodes to {size} bytes, over the {DOC_MAX_BYTES}-byte "
                "limit; keep large data in files or entries and store a reference"
            )
        return text


def updated(fn: Callable[[Any], Any], value: Any) -> Any:
    """``fn`` applied to a draft (a deep copy) of ``value``: what it returns, or, when it
    returns None, the draft it changed in place (``lambda d: d["items"].append(x)``)."""
    draft = copy.deepcopy(value)
    returned = fn(draft)
    return draft if returned is None else returned


_registry: dict[str, Doc] = {}
_registry_lock = threading.Lock()


def define_doc(
    kind: str,
    version: int,
    initial: Any,
    migrate: Migrate | None = None,
    history: HistoryRule = "latest",
    fork: ForkRule = "initial",
) -> Doc:
    """Define (and register) a document kind. Defining the same kind again with the same
    definition returns it; a different definition of a known kind raises ``DocError``."""
    if not isinstance(kind, str) or not kind:
        raise DocError(f"Expected a non-empty str kind but got kind={kind!r}")
    if not isinstance(version, int) or version < 1:
        raise DocError(f"Expected an int version >= 1 but got version={version!r}")
    if history not in ("latest", "rewindable"):
        raise DocError(f"history must be 'latest' or 'rewindable', got {history!r}")
    if fork not in ("initial", "current", "as_of"):
        raise DocError(f"fork must be 'initial', 'current' or 'as_of', got {fork!r}")
    if fork == "as_of" and history != "rewindable":
        raise DocError(
            f"document {kind!r}: fork='as_of' needs history='rewindable' (a latest-only "
            "document cannot be read as of the fork entry)"
        )
    doc = Doc(kind, version, copy.deepcopy(initial), migrate, history, fork)
    doc.encode(doc.initial)
    with _registry_lock:
        known = _registry.get(kind)
        if known is not None:
            same = (known.version, known.history, known.fork, known.initial) == (
                doc.version, doc.history, doc.fork, doc.initial
            )
            if not same:
                raise DocError(
                    f"document {kind!r} is already defined differently; give each kind one "
                    "definition (raise its version and add migrate to change it)"
                )
            return known
        _registry[kind] = doc
    return doc


def lookup_doc(kind: str) -> Doc:
    try:
        return _registry[kind]
    except KeyError:
        raise UnknownDoc(f"document kind {kind!r} was never defined; call define_doc "
                         "first") from None


def defined_docs() -> list[Doc]:
    with _registry_lock:
        return list(_registry.values())
