"""Admission control: provider quotas and tenant limits, checked before a task is claimed.

Import from the modules themselves (``floodway.limits.admission``, ``.base``, ``.backend``...):
this package imports nothing, so a process without Redis never loads its client.
"""
