"""Managed API keys, their usage ledger and the key label of metrics: what a platform team
needs to hand out keys and know who used what (`docs/keys.md`)."""
