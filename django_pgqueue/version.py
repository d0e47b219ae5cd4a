"""The package's version (pyproject.toml's, kept equal by tests/unit/test_layers.py)."""

__version__ = "0.1.0"
