"""Reviewing what an agent changed: the workspace as of any entry of its log, diffs between
two entries, and forks that continue from one (``python -m durable.review``)."""

from .workspace_state import FileState, NoWorkspaceState, state_at, unified_diff

__all__ = ["FileState", "NoWorkspaceState", "state_at", "unified_diff"]
