"""What every stage may import: shared records, errors, the run directory (imports nothing of tepo_cli outside core)."""
