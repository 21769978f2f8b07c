"""The package version: one place, read by the package, the API and the outbox."""

__version__ = "0.1.0"
