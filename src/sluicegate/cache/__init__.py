"""Response cache: keys (`key`), stored form (`entry`), TTL policy (`ttl`), stores (`store`),
and the lookup / single-flight logic that ties them together (`response_cache`)."""

from sluicegate.cache.response_cache import CacheConfig, CacheControl, Lease, Lookup, ResponseCache

__all__ = ["CacheConfig", "CacheControl", "Lease", "Lookup", "ResponseCache"]
