"""Example configs and helpers; importable from the repository root (``examples.mappings``)."""
