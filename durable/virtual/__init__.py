"""Virtual workspaces: the coding tools with no sandbox, their files in the session's log
(``tools.virtual``). See ``tools`` for the tools, ``workspace`` for where files are kept,
``shell`` for the shell and what it can reach, ``blob_store`` for larger files."""

from .blob_store import BlobStore, DamagedBlob
from .shell import Node, ShellLimits, Tree
from .tools import Virtual, virtual, workspace_instructions, workspace_tools
from .workspace import VirtualLimits

__all__ = ["BlobStore", "DamagedBlob", "Node", "ShellLimits", "Tree", "Virtual",
           "VirtualLimits", "virtual", "workspace_instructions", "workspace_tools"]
