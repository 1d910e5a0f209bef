"""A campaign spread over machines: its runs as tasks on a Dask cluster (``dask_pool``, with
the worker's side in ``worker``) and the shards of ``chaos run --shard`` joined into one
campaign (``merge``). This package's ``__init__`` imports nothing."""
