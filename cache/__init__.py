"""The global L3 KV cache service and the cost-aware router (issue #8)."""
