"""The global L3 KV cache and the fleet model behind the cost-aware router.

- ``blocks``: a KV block (hash, metadata, payload), its checks and its chunks on the wire;
- ``store``: blocks as files in a local or mounted directory, LRU eviction at capacity, kept across restarts;
- ``service``: the gRPC Cache service (Lookup, Put, Get, Stats); ``cli``: ``forge-cache``;
- ``ring``, ``client``: several servers sharing the hash space by consistent hashing, client-side;
- ``events``: actors' KV events (stored, evicted block hashes) in a log routers poll;
- ``fleet``: what a router knows of each actor (cached blocks, layout, speeds) and of the L3 cache;
- ``meters``: EWMAs and rates measured online.

The block-hash scheme shared by actors, cache and router is ``forge.kvhash``. The routers themselves are in
``forge.gateway.cost_router``; the actor side is ``forge.actors.engine.l3``. See docs/cache.md.
"""
