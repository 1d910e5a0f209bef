"""The crash campaign, a folder per role (Jepsen's split): ``campaign`` (many runs, their
records, SUMMARY and the CI subset), ``run`` (one run and the processes it owns), ``faults``
(the nemesis: kinds, plans, schedule), ``modes``, ``checks`` (the invariant checker),
``cluster`` (Dask and shards) and ``repro`` (replay and shrink); the CLI and the driver
program at the top."""
