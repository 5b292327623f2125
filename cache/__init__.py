"""The global L3 KV cache.

- ``blocks``: a KV block (hash, metadata, payload), its checks and its chunks on the wire;
- ``store``: blocks as files in a local or mounted directory, LRU eviction at capacity, kept across restarts;
- ``service``: the gRPC Cache service (Lookup, Put, Get, Stats); ``cli``: ``forge-cache``;
- ``ring``, ``client``: several servers sharing the hash space by consistent hashing, client-side;
- ``events``: actors' KV events (stored, evicted block hashes) in a log routers poll;
- ``meters``: EWMAs and rates measured online.

The block-hash scheme shared by actors, cache and router is ``forge.kvhash``. The routers that use the cache, with
their model of each actor and of L3 (``fleet``), are in ``forge.gateway.routing``; the actor side is
``forge.actors.engine.l3``. See docs/cache.md.
"""
