"""The durable agent runtime: log, harness, Space adapter, session driver."""
