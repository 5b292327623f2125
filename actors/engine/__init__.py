"""The embedded torch engine (``engine.TorchEngine``): continuous batching over a paged KV cache, in the server's
process or in a process of its own (``core``, ``process``)."""
