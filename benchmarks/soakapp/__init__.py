"""The invariant soak's own app (benchmarks/soak.py): its record tables and its job types."""
