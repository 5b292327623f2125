"""The Rollout Engine: actor servers and their inference backends (embedded torch engine, TensorRT-LLM; no vLLM yet)."""
