"""Admission control: provider quotas and tenant limits, checked before a task is claimed."""

from floodway.limits.base import Admission, NoLimits, Permit, Settlement

__all__ = ["Admission", "NoLimits", "Permit", "Settlement"]
