"""just-bash's ``seq`` and ``awk`` made to keep the virtual shell's limits, or say why not.

just-bash 0.2 stops both without a word: ``seq`` at 100000 numbers, and an awk ``while`` or
``for`` loop after 10000 iterations whatever ``max_awk_iterations`` says, going on as if the
loop had ended by itself. Its awk also ignored ``break``, ``continue``, ``do``-``while`` and
a loop body without braces (``while (i < 5) i++`` did nothing). Each would hand the agent a
wrong answer with exit 0; here a loop runs as awk runs it, and a loop that reaches
``max_loop_iterations`` ends the call at that limit, named, like every other limit.

Imported only in a shell worker (just-bash takes about 0.25 s to import).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from typing import Any

from just_bash.commands.awk.awk import AwkCommand, AwkState
from just_bash.interpreter import ExecutionLimitError
from just_bash.types import ExecResult

#: just-bash's ``seq`` stops at this many numbers without a word.
SEQ_CAP = 100_000


class BoundedSeq:
    """just-bash's ``seq``: when it stopped short of LAST at ``SEQ_CAP`` numbers the call
    ends at a limit, named, instead of going on with part of the sequence."""

    name = "seq"

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def execute(self, args: list[str], ctx: Any) -> Any:
        result = await self.inner.execute(args, ctx)
        numbers = [a for a in args if _is_number(a)]
        printed = result.stdout.split()
        if result.exit_code == 0 and len(printed) >= SEQ_CAP and numbers and \
                _is_number(printed[-1]) and float(printed[-1]) != float(numbers[-1]):
            # The whole call ends, as at any limit: in a pipeline an error of seq's own
            # would be lost and the rest would run on a cut sequence.
            raise ExecutionLimitError(f"seq {' '.join(args)}: more than {SEQ_CAP} numbers",
                                      "seq")
        return result


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


class _Break(Exception):
    pass


class _Continue(Exception):
    pass


class _Unsupported(Exception):
    """A form this awk cannot run as awk would: the command fails (exit 2, as awk does on
    a program it cannot parse) rather than run something else."""


class BoundedAwk(AwkCommand):
    """just-bash's awk whose ``while``, ``do``-``while`` and C-style ``for`` loops run as
    awk runs them (bodies with or without braces, ``break``, ``continue``) and end the call
    at ``max_iterations`` iterations of one loop."""

    def __init__(self, max_iterations: int) -> None:
        self.max_iterations = max_iterations

    async def execute(self, args: list[str], ctx: Any) -> ExecResult:
        try:
            return await super().execute(args, ctx)
        except (_Break, _Continue):
            return ExecResult(stdout="", stderr="awk: break or continue outside a loop\n",
                              exit_code=2)
        except _Unsupported as exc:
            return ExecResult(stdout="", stderr=f"awk: {exc}; the virtual workspace's awk "
                              "(just-bash) cannot run it: rewrite it, or use a Space\n",
                              exit_code=2)

    def _execute_statement(self, stmt: str, state: AwkState, fields: list[str],
                           line: str) -> None:
        stmt = stmt.strip()
        word = re.match(r"[A-Za-z_]\w*", stmt)
        keyword = word.group(0) if word else ""
        if keyword == "break":
            raise _Break
        if keyword == "continue":
            raise _Continue
        if keyword == "while":
            condition, body = _header_and_body(stmt, "while")
            self._loop(condition, body, state, fields, line)
        elif keyword == "do":
            self._do_while(stmt, state, fields, line)
        elif keyword == "for" and not re.match(r"for\s*\(\s*\w+\s+in\s", stmt):
            header, body = _header_and_body(stmt, "for")
            parts = _split_top_level(header, ";")
            if len(parts) != 3:
                raise _Unsupported(f"'for ({header})' has {len(parts)} parts, not 3")
            init, condition, update = (p.strip() for p in parts)
            if init:
                self._execute_statement(init, state, fields, line)
            self._loop(condition, body, state, fields, line, update=update)
        else:
            super()._execute_statement(stmt, state, fields, line)

    def _do_while(self, stmt: str, state: AwkState, fields: list[str], line: str) -> None:
        rest = stmt[len("do"):].strip()
        if not rest.startswith("{"):
            raise _Unsupported(f"'{stmt}': a do loop whose body has no braces")
        end = _closing(rest, 0, "{", "}")
        after = rest[end + 1:].strip()
        if not re.match(r"while\s*\(", after):
            raise _Unsupported(f"'{stmt}': a do loop without its while (condition)")
        condition, tail = _header_and_body(after, "while")
        if tail:
            raise _Unsupported(f"'{stmt}': text after the do loop's condition")
        self._loop(condition, rest[:end + 1], state, fields, line, test_first=False)

    def _loop(self, condition: str, body: str, state: AwkState, fields: list[str],
              line: str, *, update: str = "", test_first: bool = True) -> None:
        if body.startswith("{") and _closing(body, 0, "{", "}") == len(body) - 1:
            body = body[1:-1]
        for done in itertools.count():
            if (test_first or done) and condition.strip() and \
                    not self._eval_condition(condition, state, fields, line):
                return
            if done >= self.max_iterations:
                raise ExecutionLimitError(
                    f"awk: a loop ran {self.max_iterations} iterations and was stopped",
                    "awk")
            try:
                self._execute_action(body, state, fields, line)
            except _Break:
                return
            except _Continue:
                pass
            if state.next_record or state.exit_program:
                return
            if update:
                self._execute_statement(update, state, fields, line)


def _header_and_body(stmt: str, keyword: str) -> tuple[str, str]:
    """``keyword (HEADER) BODY`` as (HEADER, BODY), parentheses balanced."""
    start = stmt.find("(", len(keyword))
    if start == -1 or stmt[len(keyword):start].strip():
        raise _Unsupported(f"'{stmt}': {keyword} without a parenthesised condition")
    end = _closing(stmt, start, "(", ")")
    return stmt[start + 1:end], stmt[end + 1:].strip()


def _closing(text: str, start: int, opening: str, closing: str) -> int:
    """The index of the ``closing`` that matches the ``opening`` at ``start``, skipping
    string literals."""
    depth = 0
    for i, char in _code(text, start):
        if char == opening:
            depth += 1
        elif char == closing:
            depth -= 1
            if depth == 0:
                return i
    raise _Unsupported(f"'{text}': an unbalanced '{opening}'")


def _split_top_level(text: str, separator: str) -> list[str]:
    """``text`` split at each ``separator`` outside parentheses and string literals."""
    parts, depth, begin = [], 0, 0
    for i, char in _code(text):
        if char in ("(", "["):
            depth += 1
        elif char in (")", "]"):
            depth -= 1
        elif char == separator and depth == 0:
            parts.append(text[begin:i])
            begin = i + 1
    return [*parts, text[begin:]]


def _code(text: str, start: int = 0) -> Iterator[tuple[int, str | None]]:
    """Each index of ``text`` from ``start``, with its character, or None where it is part
    of a string literal or an escape."""
    in_string, escaped = False, False
    for i in range(start, len(text)):
        char = text[i]
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == '"':
            in_string = not in_string
        else:
            yield i, None if in_string else char
            continue
        yield i, None
