"""The domain: task model, the states table, error classes and outcomes."""
