"""The global L3 KV cache service, ``forge-cache``.

- ``store``: blocks as files in a local or mounted directory, LRU eviction at capacity, kept across restarts;
- ``servicer``: the gRPC Cache service (Lookup, Put, Get, Stats); ``cli``: ``forge-cache``; ``config``: its settings.

What the cache's users share with it lives in the core: the block format, the client and its hash ring, KV events
(``forge.kv``) and the block-hash scheme (``forge.kvhash``). The routers that use the cache, with their model of each
actor and of L3 (``fleet``), are in ``forge.gateway.routing``; the actor side is ``forge.actors.engine.l3``. See
docs/cache.md.
"""
