"""Random-weight checkpoints of model families Forge does not implement, written by transformers: small configs
that keep each family's quirks (sliding windows, soft-capping, tied heads, partial RoPE)."""

from __future__ import annotations

import random
from pathlib import Path

import torch
import transformers

from forge.learner.policy import recompute_logprobs
from forge.learner.samples import Sample, make_micro_batch
from forge.v1 import common_pb2, pool_pb2

SMALL = {"vocab_size": 96, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
         "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
# A shape vLLM's CPU attention serves (head size 32).
SERVABLE = {**SMALL, "vocab_size": 256, "hidden_size": 128, "intermediate_size": 256, "max_position_embeddings": 512}
FAMILIES = {
    "llama": (transformers.LlamaConfig, {}),
    "qwen2": (transformers.Qwen2Config, {}),
    "mistral": (transformers.MistralConfig, {"sliding_window": 4}),
    "gemma2": (transformers.Gemma2Config, {"head_dim": 8, "sliding_window": 4, "final_logit_softcapping": 30.0,
                                           "attn_logit_softcapping": 50.0, "query_pre_attn_scalar": 8}),
    "gemma3_text": (transformers.Gemma3TextConfig, {"head_dim": 8, "sliding_window": 4, "query_pre_attn_scalar": 8}),
    "phi3": (transformers.Phi3Config, {}),
    "olmo2": (transformers.Olmo2Config, {}),
    "glm4": (transformers.Glm4Config, {"head_dim": 8}),
    "smollm3": (transformers.SmolLM3Config, {}),
}


def write_family(directory: Path, family: str, seed: int = 0, shape: dict | None = None, **overrides):
    """(directory, the transformers model) of a random ``family`` checkpoint written there."""
    config_class, quirks = FAMILIES[family]
    torch.manual_seed(seed)
    config = config_class(**{**(shape or SMALL), **quirks, **overrides})
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    model.save_pretrained(directory)
    return directory, model.eval()


def with_tiny_tokenizer(directory: Path) -> Path:
    """``directory`` with the built-in model's tokenizer and chat template beside its weights (ids below 1024)."""
    from forge.assets import TINY_DIR

    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (directory / name).write_bytes((TINY_DIR / name).read_bytes())
    return directory


def fill_on_policy(pool, policy, groups: int, vocab: int, group_size: int = 2, seed: int = 7,
                   system_len: int = 0) -> None:
    """Groups of one-call sessions with random prompts (after a shared system prompt of ``system_len`` tokens) and
    completions that carry ``policy``'s own log-probs at temperature 1 (what an actor serving it would have
    recorded), rewarded 0, 1, ... within each group."""
    rng = random.Random(seed)
    system = [rng.randrange(3, vocab) for _ in range(system_len)]
    for group in range(groups):
        for member in range(group_size):
            session = pool.open_session(task_id=f"t{group}", group_id=f"g{group}", group_size=group_size).session_id
            prompt = system + [rng.randrange(3, vocab) for _ in range(rng.randrange(3, 9))]
            completion = [rng.randrange(3, vocab) for _ in range(rng.randrange(2, 7))]
            sample = Sample(tokens=prompt + completion, prompt_len=len(prompt), old_logprobs=[0.0] * len(completion),
                            versions=[0] * len(completion), advantage=0.0, temperature=1.0, top_k=0, top_p=1.0,
                            domain="d", position=0, session_id=session, call_index=0)
            logprobs = recompute_logprobs(policy.eval(), make_micro_batch([sample])).tolist()
            pool.append_call(pool_pb2.CallRecord(
                session_id=session, index=0, prompt_ids=prompt, completion_ids=completion, logprobs=logprobs,
                weight_versions=[0] * len(completion), finish_reason=1,
                sampling=common_pb2.SamplingParams(temperature=1.0)))
            pool.close_session(session_id=session, outcome_rewards={"r": float(member)})
