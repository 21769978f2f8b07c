"""Persistence behind a narrow protocol of domain verbs (:class:`floodway.store.base.Store`)."""

from floodway.store.base import Store
from floodway.store.factory import open_store

__all__ = ["Store", "open_store"]
