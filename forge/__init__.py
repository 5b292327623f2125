"""Forge: reinforcement learning of LLM agents at scale.

The shared core lives here (model, tokenizer, configuration, gRPC helpers, CLIs); the services are the
subpackages ``forge.learner``, ``forge.actors``, ``forge.gateway`` and ``forge.cache``, and the wire contracts are
the generated stubs in ``forge.v1``.
"""

__version__ = "0.1.0"
