"""The benchmark's own tiny Django app: an invoice table and two no-op job types."""
