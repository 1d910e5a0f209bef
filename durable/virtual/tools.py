"""``virtual()``: the coding tools on a workspace with no sandbox at all.

``virtual()`` is an extension: plugged into a harness it gives ``read``, ``write``, ``edit``
and ``bash`` (the names, schemas and descriptions of ``durable.coding_tools``) on
``/workspace``, whose files live in the session's log (``workspace.LogWorkspaces``) and so
move with it to any machine. A registry that already has the coding tools gets them
replaced (``wrap``); one without gets them added (``tools``): the same agent code runs on
a Space or here. Every tool is ``replay="safe"``: its effect is only in the log, committed
with its result, so a call cut off by a crash left nothing and simply runs again.

``virtual(durable=False)``: the same tools on files in memory, cleared at the end of every
turn (each input the conversation answers starts with an empty workspace), nothing in the
log; the tools' descriptions say so.

``workspace_tools(v)`` (``bash``, ``read_file``, ``write_file``, ``edit_file``,
``list_files``) and ``workspace_instructions(v)`` are for a loop of your own.
"""

from __future__ import annotations

from typing import Any

from ..coding_tools import coding_tools
from ..failpoints import failpoint
from ..harness import Harness
from ..log import Log
from ..tools import CallContext, Tool, ToolResult
from .env import VirtualEnv
from .shell import ROOT, Tree
from .workspace import LogWorkspaces, ScratchWorkspaces, VirtualLimits, over_limits, turn_of

SCRATCH_NOTE = (" The workspace is scratch space in memory: its files are cleared at the end "
                "of every turn and are lost if the session's process restarts.")
LIST_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"path": {"type": "string"}},
    "additionalProperties": False,
}


class Virtual:
    """The virtual workspace extension; make it with ``virtual()``."""

    def __init__(self, *, durable: bool = True, limits: VirtualLimits | None = None,
                 initial: Tree | None = None) -> None:
        self.limits = limits or VirtualLimits()
        self.durable = durable
        if not durable and initial:
            raise ValueError("initial files need a durable workspace (scratch files are "
                             "cleared every turn); pass durable=True or no initial files")
        self.files: LogWorkspaces | ScratchWorkspaces = (
            LogWorkspaces(self.limits, initial) if durable else ScratchWorkspaces(self.limits))
        self._wrapped: set[str] = set()

    # -- the extension -----------------------------------------------------------

    def tools(self) -> list[Tool]:
        return [self._on_files(t) for t in coding_tools() if t.name not in self._wrapped]

    def wrap(self, tool: Tool) -> Tool | None:
        plain = {t.name: t for t in coding_tools()}.get(tool.name)
        if plain is None or tool.run is not plain.run:
            return None  # not a coding tool (a tool of the same name of your own stays)
        self._wrapped.add(tool.name)
        return self._on_files(plain)

    # -- what the session driver asks of a workspace provider ---------------------

    @property
    def extension(self) -> Virtual:
        return self

    #: The tools find their files themselves; the harness gives them no env.
    env = None

    def raise_epochs(self) -> None:
        """Nothing to fence: the files live in the log, whose own fence is the epoch's."""

    def ensure_space(self, harness: Harness, conversation: int) -> None:
        """Commit the initial files before the first turn (durable workspaces)."""
        if isinstance(self.files, LogWorkspaces):
            self.files.seed(harness.log, conversation)

    # -- reading it ----------------------------------------------------------------

    def snapshot(self, log: Log, conversation: int) -> Tree:
        """The files of ``conversation`` as its log holds them (every content checked)."""
        if not isinstance(self.files, LogWorkspaces):
            raise ValueError("a scratch workspace keeps nothing in the log; use durable=True")
        return self.files.tree(log, conversation)

    # -- the tools -----------------------------------------------------------------

    def _on_files(self, tool: Tool, *, name: str | None = None,
                  description: str | None = None) -> Tool:
        """``tool`` run against this call's files, its change kept (see the module doc)."""

        def run(args: dict[str, Any], ctx: CallContext) -> ToolResult:
            before = self._tree(ctx)
            env = VirtualEnv(dict(before), self.limits.shell)
            ctx.env = env
            out = tool.run(args, ctx)
            result = out if isinstance(out, ToolResult) else ToolResult(str(out))
            if env.limit is not None:
                result = ToolResult(f"{result.content}\n{env.limit}", is_error=True,
                                    details={**result.details, "limit": env.limit})
            failpoint("virtual.ran", call=ctx.call_id, tool=tool.name)
            if env.tree != before:
                problem = over_limits(env.tree, self.limits)
                if problem is not None:
                    return ToolResult(f"Error: {problem}. The call's changes were not kept.",
                                      is_error=True)
                self._keep(ctx, env.tree)
            return result

        text = description or tool.description
        if not self.durable:
            text += SCRATCH_NOTE
        return Tool(name or tool.name, text, tool.schema, run, "safe")

    def _tree(self, ctx: CallContext) -> Tree:
        if isinstance(self.files, LogWorkspaces):
            return self.files.tree(ctx.log, ctx.conversation)
        return self.files.tree(ctx.log, ctx.conversation, turn_of(ctx))

    def _keep(self, ctx: CallContext, tree: Tree) -> None:
        if isinstance(self.files, LogWorkspaces):
            self.files.record(ctx, tree)
        else:
            self.files.keep(ctx.log, ctx.conversation, turn_of(ctx), tree)


def virtual(*, durable: bool = True, limits: VirtualLimits | None = None,
            initial: Tree | None = None) -> Virtual:
    """The virtual workspace extension (see the module docstring). ``initial``: the files
    each conversation starts with (durable only)."""
    return Virtual(durable=durable, limits=limits, initial=initial)


def _list(args: dict[str, Any], ctx: CallContext) -> ToolResult:
    env = ctx.env
    assert isinstance(env, VirtualEnv)
    rel = env.resolve(args.get("path") or ".")
    prefix = rel + "/" if rel else ""
    lines = []
    for path, node in sorted(env.tree.items()):
        if not path.startswith(prefix):
            continue
        lines.append(f"{path} -> {node.data.decode('utf-8', 'replace')}" if node.kind ==
                     "symlink" else f"{path} ({len(node.data)} bytes, mode {node.mode:o})")
    if not lines and prefix and rel not in env.tree:
        return ToolResult(f"no files under {args.get('path')}", is_error=False)
    return ToolResult("\n".join(lines) if lines else "the workspace is empty")


#: The coding tool behind each of ``workspace_tools``'s names, and its description there.
WORKSPACE_TOOLS: dict[str, tuple[str, str]] = {
    "bash": ("bash", f"Run a bash command in {ROOT} (a bash-compatible shell in Python: "
                     "coreutils, grep, sed, awk, jq; no network, no other programs)."),
    "read_file": ("read", "Read a file of the workspace (optionally a range of lines)."),
    "write_file": ("write", "Write a file of the workspace, replacing its content."),
    "edit_file": ("edit", "Replace exact text in a file; each old_text must match once."),
}


def workspace_tools(v: Virtual) -> list[Tool]:
    """``bash``, ``read_file``, ``write_file``, ``edit_file`` and ``list_files`` on the
    virtual workspace ``v``, for a loop of your own."""
    plain: dict[str, Tool] = {t.name: t for t in coding_tools()}
    out = [v._on_files(plain[base], name=name, description=text)
           for name, (base, text) in WORKSPACE_TOOLS.items()]
    lister = Tool("list_files", "List the files of the workspace (under path, if given) "
                  "with their sizes and modes, and symlinks with their targets.",
                  LIST_SCHEMA, _list, "safe")
    out.append(v._on_files(lister))
    return out


def workspace_instructions(v: Virtual) -> str:
    """What to tell the agent about its workspace, for its instructions."""
    lim = v.limits
    lasts = ("Its files are kept in the session's log: they last for the whole session, "
             "across restarts and on any machine the session moves to."
             if v.durable else
             "Its files are scratch space in memory: they are cleared at the end of every "
             "turn (each new request starts with an empty workspace) and lost if the "
             "session restarts; keep nothing there you need later.")
    return (f"You work in a virtual workspace at {ROOT}. {lasts} It holds at most "
            f"{lim.max_files} files and {lim.max_bytes // (1024 * 1024)} MiB. The bash tool "
            "is a bash-compatible shell written in Python, with coreutils, grep, sed, awk "
            "and jq: there is no network, no package manager and no other programs, and "
            "background jobs run to the end before the command returns. Only files under "
            f"{ROOT} are kept. A command may run at most {lim.shell.timeout_s:g} s and "
            f"{lim.shell.max_commands} commands, and print at most "
            f"{lim.shell.max_output_bytes // 1024} KiB.")


__all__: list[str] = ["Virtual", "virtual", "workspace_instructions", "workspace_tools"]
