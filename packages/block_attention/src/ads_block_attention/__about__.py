"""Single source of the package version (read by hatchling)."""

__version__ = "0.2.0"
