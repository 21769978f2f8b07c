"""What the tests and the benchmarks share to run floodway for real: worker and API
processes, a private Redis or PostgreSQL server, a fresh database, bounded waits. Not part of
the package: it lives beside ``tests/`` and ``bench/``, which both import it (and never each
other's modules for it)."""
