"""Single source of the package version (read by hatchling and by ``lp_fa4.__version__``)."""

__version__ = "0.1.0"
