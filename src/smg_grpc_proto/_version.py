"""The package version. scripts/release.py keeps it equal to pyproject.toml and Cargo.toml."""

__version__ = "0.5.0"
