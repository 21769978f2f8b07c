"""Floodway apps for benchmarks whose worker runs in a separate process
(``floodway worker --app bench.apps.q1:fw``), and the configuration they share with the
in-process runs, so both measure the very same setup."""
