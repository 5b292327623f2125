"""The gateway, the agents' one door to the model: white-box agents over gRPC (``servicer``), black-box agents over
the OpenAI HTTP API (``http/``), both through one facade (``service``) that keeps sessions, renders chat templates,
splices token-in-token-out histories (``tito``), routes every call to an actor (``routing/``, ``actors``) and records
it in the Data Pool (``async_pool``; the pool itself is ``forge.pool``) before answering."""
