"""The response cache: keys (`key`), the stored form (`entry`), the TTL policy (`ttl`), the
stores (`store`), one generation shared by identical requests (`flight`), the memos that let
a repeated body skip the pipeline (`fast_path`), and lookup (`response_cache`)."""
