"""Benchmarks of marl-runner: the runner against a bare sampling loop (see README.md)."""
