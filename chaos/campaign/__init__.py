"""A campaign of many runs: its flags (``run_args``), where its runs execute (``run_pool``),
the campaign itself (``campaign``), its results directory (``records``), progress, SUMMARY,
plots and coverage of the recovery table, the fixed-seed CI subset (``ci_subset``), what it
owns while it runs (``live``), which code it ran (``code_identity``) and its throughput
bench (``bench``). This package's ``__init__`` imports nothing."""
