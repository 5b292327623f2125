"""The Rollout Engine: actor servers and their inference backends (the embedded torch engine, vLLM, TensorRT-LLM),
each built by its factory (``factory``)."""
