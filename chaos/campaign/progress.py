"""How far a campaign or a shrink is, on stderr: a live bar on a terminal, a line per run
elsewhere.

Why: a campaign or a shrink runs for minutes or hours. A person at a terminal wants to see,
at a glance and without a screenful of lines, how many runs are done, whether any failed
yet, how many faults fired, the rate and the time left: a ``rich`` progress bar, redrawn in
place. Logs and scripts want what they always had, one line per run
(``run 4 seed=5 ok kills=5 4.8s (6/10)``; ``ci/docker.sh`` greps the ``ok`` ones out to show
the rest), so off a terminal those lines stay byte for byte. ``--quiet`` shows neither (what
the command prints on stdout, failures and SUMMARY, still prints); ``--verbose`` shows the
lines on a terminal too, for a person who wants every run's line in the scrollback.

The command line sets the display for the command it runs (``shown``) and the campaign or
shrink it starts reads it: ``chaos shrink`` reaches the shrinker through ``chaos.repro.replay``,
and the benchmarks through ``run_campaign``, neither of which need carry it.

The bar is stopped on every way out of its ``with`` block (the end, an exception, Ctrl-C):
the cursor is shown again and the bar's last state stays on the screen above what the
command prints next (a campaign's: its SUMMARY), or is erased (a shrink's, whose result is
printed while it runs).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from types import TracebackType
from typing import Self, TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    ProgressColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.progress import Progress as Bar
from rich.text import Text

from chaos.faults.plans import KIND_COUNTS

AUTO, QUIET, VERBOSE = "auto", "quiet", "verbose"
_DISPLAY: ContextVar[str] = ContextVar("chaos_progress_display", default=AUTO)

#: The counts of a run record that are faults fired, as the SUMMARY sums them: the
#: nemesis's injuries and the coordinator's kills (``fenced`` and ``timeouts`` are what
#: the drivers did, not faults).
FAULT_COUNTS = (*KIND_COUNTS.values(), "coordinator_kills")
#: Seconds of finished runs the rate (and so the time left) is taken over: runs end in
#: bursts, as many as run at once, so a short window would jump about.
RATE_WINDOW_S = 300.0


def faults_fired(counts: Mapping[str, int]) -> int:
    """The faults a run record's ``counts`` say fired."""
    return sum(counts.get(key, 0) for key in FAULT_COUNTS)


@contextmanager
def shown(display: str) -> Iterator[None]:
    """Campaigns and shrinks started in this block show their progress as ``display``
    (``auto``: the bar on a terminal, else lines; ``quiet``; ``verbose``: lines)."""
    if display not in (AUTO, QUIET, VERBOSE):
        raise ValueError(f"display {display!r} is not one of {AUTO}, {QUIET}, {VERBOSE}")
    token = _DISPLAY.set(display)
    try:
        yield
    finally:
        _DISPLAY.reset(token)


def add_flags(parser: argparse.ArgumentParser, *, lines: str, kept: str) -> None:
    """``--quiet`` and ``--verbose`` (exclusive; ``args.display``) on ``parser``: ``lines``
    says what the per-run lines are, ``kept`` what still prints with ``--quiet``."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--quiet", action="store_const", dest="display", const=QUIET,
                       default=AUTO, help=f"no progress on stderr, neither the bar nor "
                       f"{lines}; stdout keeps {kept}")
    group.add_argument("--verbose", action="store_const", dest="display", const=VERBOSE,
                       help=f"{lines} on stderr even on a terminal, in place of the progress "
                       "bar (off a terminal they are the default)")


class Progress:
    """Runs done (of ``total``; None: not known ahead, as a shrink's), failed, faults fired.

    Use it as a context manager; ``advance`` once per finished run (from any thread), and
    ``echo`` for what the command prints meanwhile, so that it lands above the bar. A
    ``transient`` bar is erased when it stops (for a command whose last lines, printed
    inside the block, are its result)."""

    def __init__(self, total: int | None, *, title: str, unit: str = "runs",
                 transient: bool = False, stream: TextIO | None = None,
                 display: str | None = None) -> None:
        self.total, self.unit = total, unit
        self.stream = sys.stderr if stream is None else stream
        self.display = _DISPLAY.get() if display is None else display
        self.done = self.failed = self.unknown = self.faults = 0
        self._lock = threading.Lock()
        self._bar: Bar | None = None
        self._task: TaskID | None = None
        if self.display == AUTO and _isatty(self.stream):
            console = Console(file=self.stream)
            if console.is_interactive:  # not TERM=dumb, nor TTY_INTERACTIVE=0 (rich's rules)
                self._bar = Bar(*_columns(unit, total), console=console, transient=transient,
                                refresh_per_second=4, speed_estimate_period=RATE_WINDOW_S,
                                redirect_stdout=_same_terminal(sys.stdout, self.stream),
                                redirect_stderr=_same_terminal(sys.stderr, self.stream))
                self._task = self._bar.add_task(title, total=total, failed=0, unknown=0,
                                                faults=0)

    @property
    def lines(self) -> bool:
        """Whether a plain line is written per run (no bar, not quiet)."""
        return self.display != QUIET and self._bar is None

    def __enter__(self) -> Self:
        if self._bar is not None:
            self._bar.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        bar, self._bar = self._bar, None
        if bar is not None:
            bar.stop()

    def advance(self, line: str, *, failed: bool, unknown: bool = False,
                faults: int = 0) -> None:
        """One more run done: ``line`` is its plain line, to which the count is added
        (``(6/10)``, or ``(6 runs)`` without a total)."""
        with self._lock:
            self.done += 1
            self.failed += failed
            self.unknown += unknown
            self.faults += faults
            if self._bar is not None and self._task is not None:
                self._bar.update(self._task, advance=1, failed=self.failed,
                                 unknown=self.unknown, faults=self.faults, refresh=True)
            elif self.lines:
                count = (f"{self.done}/{self.total}" if self.total is not None
                         else f"{self.done} {self.unit}")
                self.stream.write(f"{line} ({count})\n")
                self.stream.flush()

    def echo(self, text: str, file: TextIO) -> None:
        """Print ``text`` (a line or more) to ``file``: above the bar when ``file`` shows on
        the bar's terminal, else straight to ``file`` (a pipe or a file keeps it all)."""
        bar = self._bar
        if bar is not None and _same_terminal(file, self.stream):
            bar.console.print(Text(text), soft_wrap=True)
        else:
            print(text, file=file, flush=True)


class _Tally(ProgressColumn):
    """Failed (and unknown, if any) runs and faults fired so far."""

    def render(self, task: Task) -> Text:
        failed, unknown = task.fields["failed"], task.fields["unknown"]
        text = Text()
        text.append(f"{failed} failed", style="bold red" if failed else "green")
        if unknown:
            text.append(f" {unknown} unknown", style="bold yellow")
        text.append(f"  {task.fields['faults']} faults", style="cyan")
        return text


class _Rate(ProgressColumn):
    """Runs per minute, over the last ``RATE_WINDOW_S`` seconds."""

    def __init__(self, unit: str) -> None:
        super().__init__()
        self.unit = unit

    def render(self, task: Task) -> Text:
        speed = task.speed
        shown_rate = "--" if speed is None else f"{60 * speed:.1f}"
        return Text(f"{shown_rate} {self.unit}/min")


def _columns(unit: str, total: int | None) -> list[str | ProgressColumn]:
    """Title, bar, done/total, failed and faults, rate, then the time left (the time so
    far when the total is not known)."""
    columns: list[str | ProgressColumn] = [
        TextColumn("[progress.description]{task.description}"), BarColumn(),
        MofNCompleteColumn(), _Tally(), _Rate(unit)]
    if total is None:
        return [*columns, TimeElapsedColumn(), TextColumn("so far")]
    return [*columns, TimeRemainingColumn(), TextColumn("left")]


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no such method, or closed
        return False


def _same_terminal(a: TextIO, b: TextIO) -> bool:
    """Whether ``a`` and ``b`` are the same terminal (what one writes shows with the other's
    output)."""
    if not (_isatty(a) and _isatty(b)):
        return False
    try:
        return os.fstat(a.fileno()).st_rdev == os.fstat(b.fileno()).st_rdev
    except (AttributeError, OSError, ValueError):
        return False
