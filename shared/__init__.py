"""Ragline's common package: configuration, models, errors and clients shared by services and workers."""

from importlib.metadata import PackageNotFoundError, version

try:
    VERSION = version("ragline")  # the installed package's: one number for REST, MCP and the CLI
except PackageNotFoundError:  # run from a checkout that was never installed
    VERSION = "0.0.0+unknown"
