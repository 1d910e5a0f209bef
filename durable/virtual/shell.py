"""The virtual workspace's shell: a bash-compatible interpreter in pure Python over files in
memory, behind an interface of ours (the one module that imports ``just_bash``).

``run_here(tree, command, limits, seconds)`` builds a fresh in-memory filesystem holding
``tree`` under ``/workspace``, runs ``command`` there with a fresh interpreter and returns
the exit status, the output and the tree as the command left it. Callers use
``shell_worker.run_shell``, which runs it in a worker process where the call's time and
memory limits hold whatever the command does; every limit a command hits is named in the
result. Nothing of the host is reachable:
the interpreter has no real binaries (its coreutils, grep, sed, awk and jq are Python), no
host files (its filesystem is a dict), an environment of its own (``HOME=/home/user``...),
no processes (``$$`` is 1, background jobs run to the end in the foreground) and no
network (``curl`` is not even registered). Only ``/workspace`` is kept: what a command
writes elsewhere (``/tmp``) is gone with the call.

Differences from bash to know (just-bash 0.2.1, checked): ``echo x > missing/f`` creates
the missing parent; stdout and stderr come back apart, so the output is stdout followed by
stderr, not interleaved; ``ln -n``, ``seq -f``, binary ``printf`` escapes above ``\\177`` and
``yes`` are not what bash does; a redirection of a loop itself (``for ...; done > f``) is
ignored (the output goes to stdout: write ``{ for ...; done; } > f``); ``sleep`` really
sleeps (within the call's time limit); ``seq`` prints at most 100000 numbers (more ends
the call at a limit, named); an ``awk`` ``for``/``while`` loop stops after 10000 iterations
without a word (just-bash's own cap, which this module cannot see).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from just_bash import InMemoryFs


#: Where the workspace is inside the shell's filesystem.
ROOT = "/workspace"


@dataclass(frozen=True)
class Node:
    """A file (its bytes and permission bits) or a symlink (its target, as bytes)."""

    kind: str  # "file" | "symlink"
    mode: int
    data: bytes


#: Workspace-relative path -> node (directories follow from the paths).
Tree = dict[str, Node]


@dataclass(frozen=True)
class ShellLimits:
    """What one ``bash`` call may use; each limit ends the call with an error naming it."""

    #: Commands executed (a loop's body counts every time it runs).
    max_commands: int = 10_000
    #: Bytes of output (stdout and stderr together) one call may produce.
    max_output_bytes: int = 1024 * 1024
    #: Seconds one call may run (the tool's own ``timeout`` argument may lower it).
    timeout_s: float = 60.0
    #: Iterations of one loop, and of an awk or sed program.
    max_loop_iterations: int = 10_000
    #: Memory one call may take beyond what its worker process needs to start.
    max_memory_bytes: int = 1 << 30


@dataclass(frozen=True)
class ShellRun:
    exit_code: int | None
    output: str
    #: The call ran past its time limit and was stopped.
    timed_out: bool
    #: A limit the call hit (commands, loop iterations, output), in words; None if none.
    limit: str | None
    #: The workspace as the command left it.
    tree: Tree


def run_here(tree: Tree, command: str, limits: ShellLimits, seconds: float) -> ShellRun:
    """Run ``command`` in this process (a shell worker's: no event loop runs here)."""
    return asyncio.run(_run(tree, command, limits, seconds))


async def _run(tree: Tree, command: str, limits: ShellLimits, seconds: float) -> ShellRun:
    # Imported here: just-bash (with aiohttp) takes about 0.25 s to import, which every
    # process that only names these types (a session driver on a Space) would pay.
    from just_bash import Bash, ExecutionLimits, InMemoryFs
    from just_bash.commands import create_command_registry
    from just_bash.interpreter import ExecutionLimitError

    from .bounded_commands import BoundedAwk, BoundedSeq

    fs = InMemoryFs()
    await fs.mkdir(ROOT, recursive=True)
    for path, node in sorted(tree.items()):
        full = f"{ROOT}/{path}"
        parent = full.rsplit("/", 1)[0]
        await fs.mkdir(parent, recursive=True)
        if node.kind == "symlink":
            await fs.symlink(node.data.decode("utf-8", "surrogateescape"), full)
        else:
            await fs.write_file(full, node.data)
            await fs.chmod(full, node.mode)
    commands = create_command_registry(include_network=False)
    commands["seq"] = BoundedSeq(commands["seq"])
    commands["awk"] = BoundedAwk(limits.max_loop_iterations)
    bash = Bash(fs=fs, cwd=ROOT, env={}, unescape_html=False, commands=commands,
                limits=ExecutionLimits(
        max_command_count=limits.max_commands,
        max_loop_iterations=limits.max_loop_iterations,
        max_sed_iterations=limits.max_loop_iterations))
    exit_code: int | None
    timed_out, limit, output = False, None, ""
    try:
        result = await asyncio.wait_for(bash.exec(command), seconds)
        exit_code, output = result.exit_code, result.stdout + result.stderr
    except TimeoutError:
        exit_code, timed_out = None, True
    except ExecutionLimitError as exc:
        exit_code, limit = 126, f"{exc} (a virtual workspace's limit: max_commands=" \
                                f"{limits.max_commands}, max_loop_iterations=" \
                                f"{limits.max_loop_iterations})"
    size = len(output.encode("utf-8", "surrogateescape"))
    if size > limits.max_output_bytes:
        limit = (f"the command wrote {size} bytes of output, over the virtual workspace's "
                 f"limit of {limits.max_output_bytes} (max_output_bytes); write large output "
                 "to a file and read parts of it")
        exit_code = 126 if exit_code == 0 else exit_code
        output = output[-limits.max_output_bytes:]
    unkept: list[str] = []
    tree = await _tree_of(fs, unkept)
    if unkept and limit is None:
        # Refused at the call that made them, never lost silently at a later one.
        limit = (f"a virtual workspace keeps files and symlinks (their directories implied "
                 f"by them), not {unkept[0]}"
                 f"{f' (and {len(unkept) - 1} more)' if len(unkept) > 1 else ''}; use a "
                 "Space for such a workspace")
        exit_code = 126 if exit_code == 0 else exit_code
    return ShellRun(exit_code, output, timed_out, limit, tree)


async def _tree_of(fs: InMemoryFs, unkept: list[str]) -> Tree:
    """The files and symlinks under the workspace root (directories are implied by them:
    an empty one is not kept, as in git); an entry of another kind is named in
    ``unkept``."""
    out: Tree = {}

    async def walk(directory: str, prefix: str) -> None:
        entries = await fs.readdir_with_file_types(directory)
        for dirent in sorted(entries, key=lambda d: d.name):
            full, rel = f"{directory}/{dirent.name}", f"{prefix}{dirent.name}"
            if dirent.is_symbolic_link:
                out[rel] = Node("symlink", 0, (await fs.readlink(full)).encode(
                    "utf-8", "surrogateescape"))
            elif dirent.is_directory:
                await walk(full, rel + "/")
            elif dirent.is_file:
                st = await fs.lstat(full)
                out[rel] = Node("file", st.mode & 0o7777, await fs.read_file_bytes(full))
            else:
                unkept.append(f"{rel!r}, which is neither a file, a directory nor a symlink")

    try:
        root = await fs.lstat(ROOT)
    except FileNotFoundError:
        return out  # the command removed the workspace itself
    if root.is_directory:
        await walk(ROOT, "")
    return out
