"""The TensorRT-LLM backend (GPU): its LLM API behind Forge's backend interface (``backend``), and how an actor builds
it (``factory``). See docs/backends.md."""
