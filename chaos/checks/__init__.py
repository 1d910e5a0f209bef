"""The invariant's named checks, one module each (``chaos.checks.checker`` says what each
guarantees), registered in ``registry``; their data (the observation, what the log implies,
the verdict) is ``model``'s. This package's ``__init__`` imports nothing, so that the data
can be read without the checks."""
