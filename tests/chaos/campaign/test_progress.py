"""Progress as people expect it: a live bar on a terminal (a real pseudo-terminal here), the
plain per-run lines byte for byte elsewhere, nothing with ``--quiet``, the lines with
``--verbose``; the bar stopped (the cursor shown again) however its block ends."""

from __future__ import annotations

import fcntl
import io
import os
import re
import signal
import struct
import subprocess
import sys
import termios
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from chaos.campaign.progress import QUIET, VERBOSE, Progress, faults_fired, shown
from chaos.campaign.records import ResultsDir
from chaos.faults.plans import FaultPlan
from chaos.repro.shrink import Candidate, Shrinker
from chaos.run.spec import RunSpec
from tests.chaos.campaign.test_campaign import campaign
from tests.chaos.test_cli_hardening import chaos, interruptible

ROOT = Path(__file__).resolve().parents[3]
PLAIN = re.compile(r"^run [0-9]+ seed=[0-9]+ ")
SHOW_CURSOR, HIDE_CURSOR = "\x1b[?25h", "\x1b[?25l"
#: Only a hang waits this long for a terminal's output.
HANG_S = 300


class Terminal:
    """A pseudo-terminal of 120 columns: ``fd`` is its terminal side, and a thread reads all
    that is written to it (so a writer never blocks on a full buffer) into ``text``."""

    def __init__(self) -> None:
        self.master, self.fd = os.openpty()
        fcntl.ioctl(self.fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        self._chunks: list[bytes] = []
        self._grew = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # EIO: every terminal side is closed
                chunk = b""
            with self._grew:
                if not chunk:
                    self._chunks.append(b"")  # the end
                    self._grew.notify_all()
                    return
                self._chunks.append(chunk)
                self._grew.notify_all()

    @property
    def text(self) -> str:
        with self._grew:
            return b"".join(self._chunks).decode(errors="replace")

    def wait_for(self, pattern: str) -> None:
        """Until ``pattern`` (a regular expression) was written; fails if the terminal
        closes first."""
        with self._grew:
            ok = self._grew.wait_for(lambda: re.search(pattern, self.text) is not None
                                     or (self._chunks and self._chunks[-1] == b""),
                                     timeout=HANG_S)
        assert ok and re.search(pattern, self.text), f"never written: {pattern!r}: {self.text!r}"

    def close_terminal_side(self) -> str:
        """Close our terminal side; everything written once the others closed theirs."""
        os.close(self.fd)
        self._reader.join(HANG_S)
        assert not self._reader.is_alive(), "a writer kept the terminal open"
        os.close(self.master)
        return self.text


@contextmanager
def chaos_on_a_terminal(argv: list[str]) -> Iterator[tuple[subprocess.Popen[bytes], Terminal]]:
    """``argv`` (a command line) with stdout and stderr on a terminal."""
    term = Terminal()
    env = {k: v for k, v in os.environ.items()
           if k not in ("FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE",
                        "COLUMNS", "LINES")}
    with subprocess.Popen(argv, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=term.fd,
                          stderr=term.fd, env={**env, "TERM": "xterm-256color"}) as proc:
        try:
            yield proc, term
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def _finished(proc: subprocess.Popen[bytes], term: Terminal) -> str:
    proc.wait(HANG_S)
    return term.close_terminal_side()


def _plain_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if PLAIN.match(line)]


def test_off_a_terminal_each_run_has_its_plain_line(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    _, summary, _ = campaign(tmp_path, mode="checkpoint", runs=2, steps=4)
    err = capsys.readouterr().err
    assert summary["runs"] == "2"
    records = {r["index"]: r for r in ResultsDir.open(tmp_path / "results" / "latest").runs()}
    lines = _plain_lines(err)
    assert len(lines) == 2, err
    for done, line in enumerate(lines, 1):
        r = records[int(line.split()[1])]
        ok = "ok" if r["verdict"]["valid"] is True else "NOT OK"
        assert line == (f"run {r['index']} seed={r['seed']} {ok} kills={r['counts']['kills']} "
                        f"{r['seconds']:.1f}s ({done}/2)")
    assert "\x1b" not in err and "\r" not in err


def test_quiet_prints_no_run_line_but_the_summary(tmp_path: Path) -> None:
    done = chaos("run", "--mode", "checkpoint", "--runs", "1", "--steps", "4", "--jobs", "1",
                 "--results", str(tmp_path / "results"), "--quiet")
    assert done.returncode in (0, 1, 2), done.stderr
    assert not _plain_lines(done.stderr) and "\x1b" not in done.stderr, done.stderr
    assert re.search(r"^SUMMARY .*runs=1 ", done.stdout, re.M), done.stdout


def test_on_a_terminal_a_bar_takes_the_place_of_the_lines(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "chaos", "run", "--mode", "checkpoint", "--runs", "2",
            "--jobs", "2", "--results", str(tmp_path / "results")]
    with chaos_on_a_terminal(argv) as (proc, term):
        text = _finished(proc, term)
    assert proc.returncode == 0, text
    assert "2/2" in text and "runs/min" in text and "failed" in text and "faults" in text, text
    assert not _plain_lines(text), text
    # the bar was stopped before the SUMMARY: the cursor shown again, no frame after it
    assert text.rindex(SHOW_CURSOR) > text.rindex("runs/min")
    assert text.index("SUMMARY ") > text.rindex(SHOW_CURSOR)


def test_verbose_on_a_terminal_prints_the_lines(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "chaos", "run", "--mode", "checkpoint", "--runs", "1",
            "--steps", "4", "--jobs", "1", "--results", str(tmp_path / "results"),
            "--verbose"]
    with chaos_on_a_terminal(argv) as (proc, term):
        text = _finished(proc, term)
    assert re.search(r"^run 0 seed=1 (ok|NOT OK) kills=[0-9]+ [0-9.]+s \(1/1\)\r?$", text,
                     re.M), text
    assert "runs/min" not in text and HIDE_CURSOR not in text, text
    assert "SUMMARY " in text


def test_the_campaign_benchmark_shows_the_bar_on_a_terminal(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "chaos.campaign.bench", "--runs", "1", "--steps", "4",
            "--jobs", "1", "--results", str(tmp_path / "results")]
    with chaos_on_a_terminal(argv) as (proc, term):
        text = _finished(proc, term)
    assert proc.returncode == 0, text
    assert "1/1" in text and "runs/min" in text and not _plain_lines(text), text
    assert text.index("chaos.campaign.bench: 1 runs") > text.rindex(SHOW_CURSOR)


def test_ctrl_c_on_a_terminal_stops_the_bar(tmp_path: Path) -> None:
    argv = interruptible("run", "--mode", "checkpoint", "--runs", "8", "--jobs", "2",
                         "--results", str(tmp_path / "results"))
    with chaos_on_a_terminal(argv) as (proc, term):
        term.wait_for(r"1/8")  # a run is done, others run
        proc.send_signal(signal.SIGINT)
        text = _finished(proc, term)
    assert proc.returncode == 130, text
    assert "Traceback" not in text
    assert "chaos: interrupted: ending" in text
    assert text.rindex(SHOW_CURSOR) > text.rindex("runs/min"), "the bar was left running"
    assert re.search(r"^SUMMARY .*verdict=interrupted", text, re.M), text
    assert text.index("SUMMARY ") > text.rindex(SHOW_CURSOR)


# ------------------------------------------------------------ the class, on a pseudo-terminal


def _record(index: int, valid: bool | str, kills: int) -> dict[str, object]:
    return {"index": index, "seed": index + 1, "verdict": {"valid": valid},
            "counts": {"kills": kills, "daemon_kills": 1, "fenced": 3, "timeouts": 2},
            "seconds": 1.25}


@pytest.mark.parametrize("ending", [RuntimeError, KeyboardInterrupt])
def test_the_bar_is_stopped_however_its_block_ends(ending: type[BaseException]) -> None:
    term = Terminal()
    with os.fdopen(os.dup(term.fd), "w") as stream:
        with pytest.raises(ending), Progress(3, title="checkpoint", stream=stream) as progress:
            progress.advance("run 0 seed=1 ok", failed=False, faults=2)
            raise ending()
        progress.echo("after the bar", stream)  # no bar left to print above
    text = term.close_terminal_side()
    assert "1/3" in text and "2 faults" in text
    assert text.endswith(f"{SHOW_CURSOR}after the bar\r\n"), repr(text[-200:])
    assert not _plain_lines(text)


def test_what_is_printed_meanwhile_goes_where_it_was_sent() -> None:
    """Above the bar when sent to the bar's terminal; whole to a file or a pipe."""
    term = Terminal()
    elsewhere = io.StringIO()
    with (os.fdopen(os.dup(term.fd), "w") as stream,
          Progress(2, title="checkpoint", stream=stream) as progress):
        progress.advance("run 0 seed=1 NOT OK", failed=True, faults=1)
        progress.echo("FAILED run=0 seed=1\n  reproduce: python -m chaos repro", stream)
        progress.echo("FAILED run=0 seed=1 (to a file)", elsewhere)
    text = term.close_terminal_side()
    assert elsewhere.getvalue() == "FAILED run=0 seed=1 (to a file)\n"
    assert "(to a file)" not in text
    assert "FAILED run=0 seed=1\r\n  reproduce: python -m chaos repro" in text
    assert "1 failed" in text


def test_lines_quiet_and_verbose() -> None:
    term = Terminal()
    with os.fdopen(os.dup(term.fd), "w") as stream:
        for display in (QUIET, VERBOSE):
            with shown(display), Progress(2, title="checkpoint", stream=stream) as progress:
                progress.advance("run 1 seed=2 ok kills=1 1.2s", failed=False)
        stream.flush()
    on_terminal = term.close_terminal_side()
    assert on_terminal == "run 1 seed=2 ok kills=1 1.2s (1/2)\r\n", repr(on_terminal)
    plain = io.StringIO()
    with Progress(None, title="shrink G1", stream=plain) as progress:
        progress.advance("candidate 1", failed=True)
        progress.advance("candidate 2", failed=False)
    assert plain.getvalue() == "candidate 1 (1 runs)\ncandidate 2 (2 runs)\n"
    assert (progress.done, progress.failed) == (2, 1)
    with pytest.raises(ValueError), shown("loud"):
        pass


def test_faults_fired_are_the_injuries_not_the_outcomes() -> None:
    counts = _record(0, True, 4)["counts"]
    assert isinstance(counts, dict)
    assert faults_fired(counts) == 5  # 4 kills + 1 daemon kill; fenced and timeouts are not


def test_a_shrink_counts_each_candidate_run(tmp_path: Path) -> None:
    """A real candidate run of a shrink, on a correct adapter: counted, with its line."""
    base = RunSpec(index=0, seed=1, campaign_mode="checkpoint", durable_mode="checkpoint",
                   backend="local", preset="default", steps=3, work_dir=tmp_path / "work",
                   plan=FaultPlan(1, ()))
    plain = io.StringIO()
    with Progress(None, title="shrink G1", stream=plain, display=VERBOSE) as progress:
        shrinker = Shrinker(base, "G1", jobs=1, progress=progress)
        record = shrinker.run_once(Candidate.whole((), 3))
    assert record.verdict.valid is True, record.verdict.errors
    assert plain.getvalue() == (f"candidate 1 faults=0 steps=3 simplified=0 does not fail G1 "
                                f"kills=0 {record.seconds:.1f}s (1 runs)\n")
    assert (progress.done, progress.failed, progress.faults) == (1, 0, 0)
