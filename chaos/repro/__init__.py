"""A failure made small and replayable: ``chaos repro`` and ``chaos analyze`` (``replay``)
and ``chaos shrink`` (``shrink``). This package's ``__init__`` imports nothing."""
