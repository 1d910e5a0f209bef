"""The crash campaign: fault plans, the kill rendezvous, Space faults, the invariant checker,
run records, SUMMARY, repro and the CLI."""
