"""Reports: cost and latency benchmarks, tables, plots and the HTML campaign report, built
from campaign run records (files) and the adapter's benchmark; see ``python -m reports``."""
