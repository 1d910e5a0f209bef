"""The local backend: each Space is a directory on this machine and a spacesd process."""

from backends.local.provider import LocalSpace, LocalSpaces

__all__ = ["LocalSpace", "LocalSpaces"]
