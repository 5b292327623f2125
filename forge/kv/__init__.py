"""KV blocks as every part sees them: the block format and its chunks on the wire (``blocks``), the client of the
L3 cache's servers (``client``) and the consistent-hash ring that spreads blocks over them (``ring``), and the KV
event log actors keep for the routers (``events``). The actors, the gateway's routers and ``forge-cache`` all use
these; the block-hash scheme they share is ``forge.kvhash``."""
