"""Pre-registered experiments: a machine-readable protocol (`protocol.yaml`) fixed before any run,
the runner that trains its runs (`tepo protocol run`), and the loader the report reads it with
(`tepo report --protocol`)."""
