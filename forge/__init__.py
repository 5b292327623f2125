"""Forge: reinforcement learning of LLM agents at scale.

Three floors, each importing only from its own room and the floors below (docs/design.md, "Code map"): the entry
points in ``forge.app``; the services ``forge.learner``, ``forge.actors``, ``forge.gateway`` and ``forge.cache``;
and the shared core here (the Data Pool, weights, model, tokenizer, KV blocks, settings and CLIs, gRPC helpers),
with the wire contracts as the generated stubs in ``forge.v1``.
"""

__version__ = "0.1.0"
