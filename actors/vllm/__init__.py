"""The vLLM backend: vLLM's ``AsyncLLM`` behind Forge's backend interface (``backend``), the worker extension that
loads weight versions in place (``worker``), its KV events renamed into Forge's block-hash chain (``kv_events``),
and how an actor builds it (``factory``). See docs/backends.md."""
