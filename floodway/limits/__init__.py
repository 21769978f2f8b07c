"""Admission control: provider quotas and tenant limits, checked before a task is claimed."""

from floodway.core.errors import LimiterUnavailable
from floodway.limits.admission import AdmissionTuning, LimitsAdmission
from floodway.limits.backend import (
    AcquireRequest,
    AcquireResult,
    Bucket,
    Debit,
    LimiterBackend,
    SlotClaim,
)
from floodway.limits.base import (
    Admission,
    BucketSnapshot,
    NoLimits,
    Permit,
    ResourceSnapshot,
    Settlement,
)
from floodway.limits.local import LocalLimiterBackend
from floodway.limits.plan import CostTooLarge
from floodway.limits.redis_backend import RedisLimiterBackend
from floodway.limits.submit_rate import SubmitRateLimiter

__all__ = [
    "AcquireRequest",
    "AcquireResult",
    "Admission",
    "AdmissionTuning",
    "Bucket",
    "BucketSnapshot",
    "CostTooLarge",
    "Debit",
    "LimiterBackend",
    "LimiterUnavailable",
    "LimitsAdmission",
    "LocalLimiterBackend",
    "NoLimits",
    "Permit",
    "RedisLimiterBackend",
    "ResourceSnapshot",
    "Settlement",
    "SlotClaim",
    "SubmitRateLimiter",
]
