"""The shim every ledger command runs under (this file runs as a script).

Why a shim: the daemon may be SIGKILLed and restarted while its commands keep running; the
new daemon is not their parent and cannot ``waitpid`` them, so the exit status would be
lost. The shim is: it leads the command's session and process group, runs
``bash -c command``, waits for it and writes the status to an exit file (temp file,
rename), which any later daemon reads (``exec_files``).

The claim file closes the other race, a daemon that dies between spawning a shim and
learning that it runs. The shim publishes ``<pid> <start time>`` by ``link(2)``-ing a
complete temp file to the claim path *before* it starts the command; a restarted daemon
that finds a key with no claim and no exit publishes ``lost`` there the same way. ``link``
fails if the path exists, so exactly one of them wins: either the daemon sees the shim's
claim (the key runs and can be awaited) or the shim sees ``lost`` and never runs the
command. A key reported ``lost`` therefore never starts later.

Containment (``spacesd.containment``): before it forks the command, and after it won the
claim, the shim enters the command's containment, named by ``CONTAIN``: a cgroup directory
(the shim writes its pid into its ``cgroup.procs``, so the command and everything it starts
are in that cgroup) or ``subreaper``. Either way the shim becomes a child subreaper, so the
command's orphans are reparented to it, and after the command exited it reaps them until
none is left: while the shim lives, they are its descendants, even one that moved itself
to another cgroup (root can). A shim that cannot enter it does not
run the command: it writes why to the output and exits 127. The daemon always gives
``CONTAIN``; a shim run by hand without it enters none.

Output: the command's stdout and stderr are a pipe the shim relays into the output file
(its own stdout), so the state disk holds a bounded amount per key however much a command
writes: once more than ``OUTPUT_WINDOW_BYTES`` wait past the part already punched out, the
oldest whole blocks are punched out of the file (``fallocate(PUNCH_HOLE)``: the file keeps
its size, so byte offsets stay valid, and readers skip the hole with ``SEEK_DATA``). Once
the exit record is written only the replayed tail (``OUTPUT_TAIL_BYTES``) is kept. All the
command wrote before it exited is in the file before its exit record; orphans that still
hold the pipe are relayed until they close it. A filesystem that cannot punch holes gets
the first ``OUTPUT_WINDOW_BYTES`` and a line saying the rest was dropped; a full state disk
drops output, never the command, and the output then ends with a line saying so before the
exit is recorded (no room for that line: no exit either, and the key reads as lost).

Launching: a Python start-up per command would be most of a command's cost (~8 ms against
~1.5 ms for the whole of a plain ``bash -c true``), so the daemon keeps one *launcher*,
``python3 -I -S shim.py --serve``, that has imported this module once and forks a shim per
command (``serve``; the daemon's side is ``shim_launcher``). A forked shim is the same shim:
it leads a new session, its stdin is /dev/null and its stdout and stderr append to the
key's output file, its environment is the one the daemon gave, and it settles the claim race
exactly as before, so nothing above depends on how it was started. The launcher runs as
long as the daemon that started it: it exits when the daemon's end of its channel closes
(a SIGKILLed daemon included), and the shims it forked go on alone, as they always did.
After the exit record a shim writes one byte to the daemon's wake-up pipe (``WAKE_FD``, if
the daemon is still the one that started it), so that a waiter learns of the exit at once
instead of at its next look.

Run by hand as ``python3 -I -S shim.py BASH CLAIM EXIT CWD COMMAND [CONTAIN]``: by path,
without the site module, importing only built-in modules (and ``ctypes``, for ``prctl``, in
subreaper mode), as the launcher does. Hence ``_signal`` (the C module under ``signal``,
without the enum wrapping that costs ~10 ms to import) and an absolute ``BASH``
(``os.execvp`` would import ``warnings``).

Failpoints: when the daemon reports failpoints it sets ``SPACESD_SHIM_FAILPOINTS`` for the
shim, which removes it before the command starts (commands never see it); once the command
exited it imports ``spacesd.failpoints`` (with socket and json) to report
``spacesd.exec.exit_writing``. Without that variable the shim imports nothing more.
"""

import os
import select
import sys
import time

TYPE_CHECKING = False  # ``typing`` is not imported either; the type checker reads this as True
if TYPE_CHECKING:
    import ctypes
    import signal as _signal  # what ``_signal`` holds, as its stub names it
    from types import ModuleType
else:
    import _signal

SHIM_PATH = os.path.abspath(__file__)
LOST = "lost\n"
#: ``CONTAIN`` for the sandbox and subreaper mechanisms (else it is a cgroup directory).
SUBREAPER = "subreaper"
_PR_SET_CHILD_SUBREAPER = 36
#: Set (to 1) by a daemon started with ``--sync-exits``: the shim flushes the filesystems
#: before it records an exit (removed before the command starts, like the failpoints').
SYNC_ENV = "SPACESD_SHIM_SYNC"
#: The variable through which the daemon gives a shim its failpoint channel (only when on).
SHIM_ENV_VAR = "SPACESD_SHIM_FAILPOINTS"
#: The launcher's descriptors: its channel with the daemon, and the daemon's wake-up pipe
#: (the write end; every shim the launcher forks holds it, and no command does).
CHANNEL_FD = 0
WAKE_FD = 3

#: Signals whose disposition must not leak from Python (which ignores SIGPIPE and SIGXFSZ)
#: or from whoever started the daemon into the user's command.
RESET_SIGNALS = (
    _signal.SIGPIPE,
    _signal.SIGXFSZ,
    _signal.SIGCHLD,
    _signal.SIGINT,
    _signal.SIGTERM,
    _signal.SIGHUP,
    _signal.SIGQUIT,
)


#: What ends a command's output when a full state disk lost part of it, from byte ``{}``.
LOST_OUTPUT = "\nspacesd: the command's output from byte {} on was lost: the state disk was full\n"
#: Output kept on the state disk for a key while its command runs (see the module docstring).
OUTPUT_WINDOW_BYTES = 8 * 1024 * 1024
#: Output kept for a key once its exit is recorded: what a replay returns. Equal to
#: ``protocol.OUTPUT_TAIL_BYTES`` (the shim imports nothing of the package).
ENDED_KEEP_BYTES = 64 * 1024
_BLOCK = 4096
_FALLOC_FL_KEEP_SIZE = 1
_FALLOC_FL_PUNCH_HOLE = 2


_LIBC: "tuple[ModuleType, ctypes.CDLL] | None" = None


def _libc() -> "tuple[ModuleType, ctypes.CDLL]":
    """``(ctypes, the C library)``, loaded on first use: a shim run by hand imports ctypes
    (milliseconds) only when it needs it; the launcher loads it once for every shim."""
    global _LIBC
    if _LIBC is None:
        import ctypes

        _LIBC = ctypes, ctypes.CDLL(None, use_errno=True)
    return _LIBC


class Output:
    """The output file (an ``O_APPEND`` descriptor), bounded by punching out its oldest
    blocks; write errors drop output and never reach the command."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.size = os.fstat(fd).st_size
        self.punched = 0
        self.keep = OUTPUT_WINDOW_BYTES
        self.dropping = False
        #: Where the output a full disk had no room for begins, if it had none.
        self.lost_from: int | None = None

    def write(self, data: bytes) -> None:
        if self.dropping:
            return
        try:
            write_whole(self.fd, data)
            self.size += len(data)
        except OSError:  # a full or failing state disk: the output is lost, not the command
            self.size = os.fstat(self.fd).st_size  # what part of it fitted
            self.lost_from = self.size
            self.dropping = True
            return
        if self.size - self.punched > self.keep:
            self.trim()

    def own_up(self) -> None:
        """Say in the output itself that a full disk lost part of it, before the exit is
        recorded: a result must never pass for a whole one. Raises if there is still no
        room; the exit is then not recorded either, and the key reads as lost."""
        if self.lost_from is not None:
            write_whole(self.fd, LOST_OUTPUT.format(self.lost_from).encode())

    def ended(self) -> None:
        """From now on keep only what a replay returns."""
        self.keep = ENDED_KEEP_BYTES
        self.trim()

    def trim(self) -> None:
        """Punch out whole blocks up to ``keep`` bytes before the end."""
        end = max(0, self.size - self.keep) // _BLOCK * _BLOCK
        if end <= self.punched:
            return
        ctypes, libc = _libc()
        libc.fallocate.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long)
        if libc.fallocate(self.fd, _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE,
                          self.punched, end - self.punched):
            self.write(f"\nspacesd: output past {self.size} bytes dropped: the state "
                       f"filesystem cannot punch holes ({os.strerror(ctypes.get_errno())})\n"
                       .encode())
            self.dropping = True
            return
        self.punched = end


def relay(pipe: int, out: Output, child: int) -> int:
    """Copy ``pipe`` into ``out`` until ``child`` exits and all it wrote is copied; return
    its wait status. The pipe stays open if orphans hold it (see ``drain``)."""
    pidfd = os.pidfd_open(child)
    poller = select.poll()
    poller.register(pipe, select.POLLIN)
    poller.register(pidfd, select.POLLIN)
    open_pipe = True
    while True:
        for fd, _ in poller.poll():
            if fd == pidfd:
                os.close(pidfd)
                status = _wait_for(child)
                if open_pipe:
                    os.set_blocking(pipe, False)
                    try:  # what the command wrote before it exited is in the pipe already
                        while data := os.read(pipe, 65536):
                            out.write(data)
                    except BlockingIOError:
                        pass
                    os.set_blocking(pipe, True)
                return status
            data = os.read(pipe, 65536)
            if data:
                out.write(data)
            else:
                poller.unregister(pipe)
                open_pipe = False


def drain(pipe: int, out: Output) -> None:
    """Relay what orphans of the command still write, until the last closes the pipe."""
    while data := os.read(pipe, 65536):
        out.write(data)


def _wait_for(child: int) -> int:
    """The wait status of ``child``; a subreaper also reaps the orphans that died first."""
    while True:
        pid, status = os.waitpid(-1, 0)
        if pid == child:
            return status


def publish(path: str, text: str) -> bool:
    """Create ``path`` holding ``text`` whole, unless it exists (then False): a reader
    never sees a claim that exists but is not complete. Not fsynced: only a power cut loses
    the page cache, and a claim it leaves missing or empty reads as lost (unclaimed keys are
    claimed lost, damaged ones are ``DAMAGED``), never as a command that can still start; a
    Space that can lose power records its exits with ``SYNC_ENV``, which flushes the claim
    with everything else."""
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        try:
            write_whole(fd, text.encode())
        finally:
            os.close(fd)
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:  # a full disk refused it: no half-written claim, no leftover either
        os.unlink(tmp)


def write_whole(fd: int, data: bytes) -> None:
    """Write all of ``data`` or raise. A full disk takes what fits and returns a short
    count (no error); the rest is written again, which then raises ``ENOSPC``: a caller
    that wrote once and went on would keep a record cut short as if it were whole."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written == 0:
            raise OSError(28, os.strerror(28))  # ENOSPC: nothing more fits
        view = view[written:]


def _start_time() -> str:
    """Field 22 of /proc/self/stat (after the parenthesised command name)."""
    with open("/proc/self/stat", "rb") as f:
        return f.read().rsplit(b")", 1)[1].split()[19].decode()


def failpoints_env(address: str | None, info: "dict[str, object]") -> "dict[str, str]":
    """(For the daemon.) The environment that makes a shim report its points through the
    failpoint channel at ``address`` with ``info`` (``process`` becomes ``shim``); empty
    when the channel is off."""
    if address is None:
        return {}
    import json

    spec = {"channel": address, "info": {**info, "process": "shim"}}
    return {SHIM_ENV_VAR: json.dumps(spec, separators=(",", ":"))}


def _failpoint(raw: str, point: str) -> None:
    """Report ``point`` through the channel ``raw`` (the value of ``SHIM_ENV_VAR``, from
    ``failpoints_env``) names. The imports happen here, once the command has exited (the
    shim runs isolated: the package is found from this file's path)."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(SHIM_PATH)))
    import json

    from spacesd.failpoints import POINTS, Channel

    spec = json.loads(raw)
    Channel(spec["channel"], POINTS, registry="spacesd.failpoints.POINTS",
            context=spec["info"]).report(point, {})


def _write_exit(path: str, status: int, failpoints: str | None, sync: bool = False) -> None:
    """The exit record, atomically (renamed into place whole). Not synced: after a power
    loss a missing or damaged exit file reads as ``lost`` (outcome unknown), which is safe,
    and the command's own writes were not synced either. With ``sync`` (``SYNC_ENV``: a
    Space that can lose power) every filesystem is flushed first, the record fsynced and the
    directory after, so an exit that was recorded survives a power loss with every write the
    command made before it. ``failpoints``: the shim's channel, if any."""
    if sync:
        os.sync()
    code = os.waitstatus_to_exitcode(status)
    exit_code, sig = (code, "null") if code >= 0 else ("null", -code)
    record = (f'{{"exit_code": {exit_code}, "signal": {sig}, '
              f'"ended_ms": {int(time.time() * 1000)}}}\n')
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        try:
            write_whole(fd, record.encode())
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:  # a full state disk: no exit (read as lost), no leftover either
        os.unlink(tmp)
        raise
    if failpoints:
        _failpoint(failpoints, "spacesd.exec.exit_writing")
    os.replace(tmp, path)
    if sync:
        dir_fd = os.open(os.path.dirname(path), os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    _wake()


#: ``WAKE_FD`` in a shim the launcher forked; None in one run by hand (fd 3 is not ours).
_wake_fd: int | None = None


def _wake() -> None:
    """Tell the daemon an exit was recorded (see the module docstring): a hint only, so a
    daemon gone (EPIPE) or a full pipe (its waiters are awake anyway) is no error."""
    if _wake_fd is None:
        return
    try:
        os.write(_wake_fd, b".")
    except OSError:
        pass


def _contain(contain: str) -> None:
    """Enter the command's containment (see the module docstring); raises OSError. A shim
    adopts its command's orphans in every mode: in a cgroup too, as a root command can
    leave its cgroup (``spacesd.containment.Cgroup``)."""
    if contain != SUBREAPER:
        with open(contain + "/cgroup.procs", "w") as f:
            f.write(f"{os.getpid()}\n")
    ctypes, libc = _libc()
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0):
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


def _main(argv: list[str]) -> None:
    bash, claim, exit_path, cwd, command, *contained = argv
    contain = contained[0] if contained else ""
    failpoints = os.environ.pop(SHIM_ENV_VAR, None)  # before the command inherits it
    sync = os.environ.pop(SYNC_ENV, None) == "1"
    if not publish(claim, f"{os.getpid()} {_start_time()}\n"):
        return  # a restarted daemon declared this key lost: it must never run
    try:
        if contain:
            _contain(contain)
    except OSError as exc:
        os.write(2, f"spacesd: cannot contain the command, so it did not run: {exc}\n"
                 .encode())
        _write_exit(exit_path, 127 << 8, failpoints, sync)  # the wait status of "exit 127"
        return
    pipe, writer = os.pipe()
    try:  # posix_spawn (vfork and exec) costs a fraction of a fork of this interpreter
        os.chdir(cwd)  # the shim's own paths are absolute; the command inherits its cwd
        child = os.posix_spawn(bash, ["bash", "-c", command], os.environ,
                               file_actions=[(os.POSIX_SPAWN_DUP2, writer, 1),
                                             (os.POSIX_SPAWN_DUP2, writer, 2)],
                               setsigdef=RESET_SIGNALS, setsigmask=())
    except OSError as exc:  # report it, then end as a shell that could not run it does
        os.write(2, f"spacesd: cannot run the command: {exc}\n".encode())
        _write_exit(exit_path, 127 << 8, failpoints, sync)
        return
    finally:
        os.close(writer)
    # Survive a SIGTERM/SIGINT/SIGHUP sent to the whole group, so that the command's death
    # by that signal is recorded. SIGKILL still ends the shim; the daemon records the kills
    # it makes itself.
    for sig in (_signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP, _signal.SIGQUIT):
        _signal.signal(sig, _signal.SIG_IGN)
    out = Output(1)
    status = relay(pipe, out, child)
    out.own_up()
    _write_exit(exit_path, status, failpoints, sync)
    out.ended()
    drain(pipe, out)
    if contain:
        _reap_all()


def _reap_all() -> None:
    """Stay until the last orphan adopted from the command has exited (see the module
    docstring), reaping each."""
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


# ------------------------------------------------------------------ the launcher


def _read_exact(fd: int, n: int) -> bytes | None:
    """``n`` bytes from ``fd``, or None at the end of the stream."""
    data = b""
    while len(data) < n:
        chunk = os.read(fd, n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def encode_request(out: str, argv: list[str], env: dict[str, str]) -> bytes:
    """A launch request: the output file, the shim's arguments and its environment, as
    NUL-separated fields (none of them can hold a NUL), after a 4-byte length."""
    fields = [out, str(len(argv)), *argv, *(f"{k}={v}" for k, v in env.items())]
    body = b"\0".join(os.fsencode(f) for f in fields)
    return len(body).to_bytes(4, "big") + body


def _decode_request(body: bytes) -> tuple[str, list[str], dict[str, str]]:
    out, count, *rest = (os.fsdecode(f) for f in body.split(b"\0"))
    argv, pairs = rest[:int(count)], rest[int(count):]
    return out, argv, dict(pair.split("=", 1) for pair in pairs)


def serve() -> None:
    """The launcher's loop: for each request on ``CHANNEL_FD``, fork a shim and answer its
    pid (a decimal line) or why it could not be forked (``!`` and the reason); return when
    the daemon closed the channel."""
    global _wake_fd
    _signal.signal(_signal.SIGCHLD, _signal.SIG_IGN)  # the kernel reaps the shims
    os.set_inheritable(WAKE_FD, False)  # shims hold it; the commands they exec do not
    os.set_blocking(WAKE_FD, False)
    _wake_fd = WAKE_FD
    _libc()  # imported here once, not in every shim (subreaper containment, long outputs)
    while (head := _read_exact(CHANNEL_FD, 4)) is not None:
        body = _read_exact(CHANNEL_FD, int.from_bytes(head, "big"))
        if body is None:
            return
        out, argv, env = _decode_request(body)
        try:  # opened here, so the file exists once the daemon has the pid
            output = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
            pid = os.fork()
        except OSError as exc:
            os.write(CHANNEL_FD, f"!cannot start a shim: {exc}\n".encode())
            continue
        if pid == 0:
            _forked_shim(output, argv, env)
        os.close(output)
        os.write(CHANNEL_FD, f"{pid}\n".encode())


def _forked_shim(output: int, argv: list[str], env: dict[str, str]) -> None:
    """Become the shim of one command (in the launcher's child), its stdout and stderr
    appending to ``output``; never returns."""
    try:
        _signal.signal(_signal.SIGCHLD, _signal.SIG_DFL)  # the shim waits for its command
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)  # also closes the channel, which is fd 0
        os.dup2(output, 1)
        os.dup2(output, 2)
        os.close(null)
        os.close(output)
        os.environ.clear()
        os.environ.update(env)
        _main(argv)
    except BaseException as exc:  # noqa: BLE001 - without an exit record the key reads as lost
        try:
            os.write(2, f"spacesd: the shim failed: {exc!r}\n".encode())
        except OSError:  # a full state disk: the key reads as lost all the same
            pass
    os._exit(0)  # never back into the launcher's loop


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve"]:
        serve()
    else:
        _main(sys.argv[1:])
    os._exit(0)  # skip the interpreter's teardown: nothing is left to flush
