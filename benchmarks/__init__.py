"""Benchmarks of django-dbqueue against a plain-SQL baseline (see bench.py and README.md)."""
