"""KV storage: the paged pools, the radix prefix cache and its HiCache host tier."""

from engine.cache.hicache import HiRadixCache
from engine.cache.kv_pool import KVPool, OutOfPagesError, PageAllocator
from engine.cache.radix_cache import RadixCache

__all__ = ["HiRadixCache", "KVPool", "OutOfPagesError", "PageAllocator", "RadixCache"]
