"""Which Space serves a conversation, and whose exec keys are whose.

Conversation ids restart at 1 in every log, so a Space named from the conversation alone
would be shared by every session on one provider: the second would adopt the first one's
files and could be answered with its recorded results. A Space is therefore named from the
session *and* the conversation, and every exec key carries the session too, so a key can
never match another session's record even inside one Space.

The session's name is free text (a coordinator's choice); the token made of it is safe on
every backend (``[A-Za-z0-9][A-Za-z0-9._-]*``, a Docker container name and a directory name
alike), bounded, and distinct for distinct names: a name that had to be cut or cleaned gets
a hash of the original appended, so ``a/b`` and ``a_b`` never meet.
"""

from __future__ import annotations

import hashlib
import re

#: Longest readable part of a session's token (a hash may follow it).
MAX_SESSION_CHARS = 24
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_PREFIX = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,23}")


def session_token(session: str) -> str:
    """A token for ``session`` that is safe in Space names and exec keys (no ``:`` or
    ``@``), at most ``MAX_SESSION_CHARS + 9`` characters, and injective."""
    if not isinstance(session, str) or not session:
        raise ValueError(f"a session needs a non-empty name, got {session!r}; pass the "
                         "session's name (the driver passes CUA_SESSION_NAME)")
    readable = _UNSAFE.sub("-", session).strip("-._")[:MAX_SESSION_CHARS].rstrip("-._")
    if readable == session:
        return session
    digest = hashlib.sha256(session.encode()).hexdigest()[:8]
    return f"{readable}-{digest}" if readable else f"s-{digest}"


def check_prefix(prefix: str) -> str:
    if not _PREFIX.fullmatch(prefix):
        raise ValueError(f"space_prefix must be 1-24 letters, digits, '.', '_' or '-', "
                         f"starting with a letter or digit; got {prefix!r}")
    return prefix


def space_name(prefix: str, token: str, conversation: int) -> str:
    """The Space of ``conversation`` in the session whose token is ``token``."""
    return f"{prefix}-{token}-c{conversation}"


def session_spaces(name: str) -> str:
    """The prefix every Space of the session that ``name`` (one of its Spaces) serves shares:
    its other conversations' Spaces are ``session_spaces(name) + str(conversation)``."""
    stem, sep, conversation = name.rpartition("-c")
    if not sep or not stem or not conversation.isdigit():
        raise ValueError(f"{name!r} is not a conversation's Space name "
                         "(<prefix>-<session>-c<conversation>)")
    return f"{stem}-c"


def exec_key(token: str, conversation: int, call_id: str, n: int, epoch: int) -> str:
    """The idempotency key of the ``n``-th command of a call:
    ``<session>:<conversation>:<call>:<n>@<epoch>``."""
    return f"{token}:{conversation}:{call_id}:{n}@{epoch}"


def call_of_key(key: str) -> tuple[int, str] | None:
    """The conversation and call id an ``exec_key`` names; None for a key of another form
    (not the adapter's)."""
    session, _, rest = key.partition(":")
    conversation, _, rest = rest.partition(":")
    call_id, sep, n_epoch = rest.rpartition(":")
    if not (session and conversation.isdigit() and call_id and sep and "@" in n_epoch):
        return None
    return int(conversation), call_id
