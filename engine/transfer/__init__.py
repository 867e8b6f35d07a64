"""NIXL transfer endpoints (one-sided WRITE of pages, notification after data)."""

from engine.transfer.endpoint import PageWrite, TransferEndpoint

__all__ = ["PageWrite", "TransferEndpoint"]
