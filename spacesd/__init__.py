"""spacesd: the daemon inside every Space (standard library only, imports nothing outside).

Modules, one job each:
- ``protocol``: message shapes, error codes, wire format, the workspace hash, the names of
  the state files an audit reads (shared with the host side);
- ``__main__``: the command line; ``server``: HTTP, auth, body limits, JSON errors;
  ``daemon``: the table of operations and how each meets the epoch fence; ``params``:
  request field checks;
- ``epoch_fence``: the persisted floor and the lock that keeps stale requests effect-free;
  ``fence_journal``: what each fence killed and found alive (``fences.jsonl``);
- ``exec_ledger``: commands at most once per key; ``journal``: its fsynced JSON-lines file;
  ``shim`` (runs as a script) and ``exec_files``: the per-command process that records
  exits; ``procfs``: process identity and group kills;
- ``file_ops`` and ``paths``: confined file operations; ``fsio``: atomic replacement;
- ``workspace_scan``: the scan and its stat cache; ``checkpoints``: content-addressed
  directory checkpoints, export and import;
- ``failpoints``: the failpoint channel's client (also the driver's) and the daemon's points;
- ``audit``: a Space's state read back from its files, with no daemon (for checkers).
"""
