"""Benchmarks and compiled-program probes (importable as `benchmarks.*` from the repo root)."""
