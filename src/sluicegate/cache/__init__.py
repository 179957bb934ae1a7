"""The response cache: keys (`key`), the stored form (`entry`), the TTL policy (`ttl`), the
stores (`store`), a miss's lease (`lease`), the memos that let a repeated body skip the
pipeline (`fast_path`), and lookup with single flight (`response_cache`)."""
