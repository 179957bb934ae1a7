"""Per-key rate limits: which limit applies (`quotas`), the windows and their decisions
(`window`), kept in Redis (`redis_limiter`) or in this process (`memory_limiter`)."""
