"""Benchmarks of marl-runner: the runner against a bare sampling loop, populations, process
backends, serving and soaks (``marl-runner bench``; docs/BENCHMARKS.md)."""
