"""Single source of the package version (read by hatchling and by ``ads_jfa.__version__``)."""

__version__ = "0.1.0"
