"""The built-in tokenizer of the tiny model: a byte-level BPE trained on generated text of the built-in domains
(arithmetic, fact-table QA, tool use), with digits split one per token, and Qwen-style chat markup.

``python tools/build_tiny_tokenizer.py`` rebuilds ``forge/assets/tiny/tokenizer.json`` and
``tokenizer_config.json`` from this module; the build is deterministic (a test checks the shipped files).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, trainers
from tokenizers import Tokenizer as _HFTokenizer

from forge.assets import TINY_DIR
from forge.tokenizer.chat_template import render_chat

ASSET_DIR = TINY_DIR
VOCAB_SIZE = 1024
CONTROL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
MARKUP_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>")
# Digits one per token (the first may carry the space before it), then GPT-2 style words, punctuation, spaces.
SPLIT_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?[0-9]| ?[A-Za-z]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+"""

_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "st", "tr", "sh")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ou")
_WORDS = ("the", "a", "of", "is", "in", "what", "who", "where", "how", "many", "which", "lives", "owns", "likes",
          "city", "color", "answer", "compute", "result", "question", "facts", "call", "tool", "tools", "value",
          "wait", "seconds", "done", "error", "total", "sum", "product", "difference", "first", "then", "and", "to")


def _name(rng: random.Random) -> str:
    return "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(rng.randint(1, 3))).capitalize()


def _expression(rng: random.Random, depth: int = 0) -> str:
    if depth > 1 or rng.random() < 0.4:
        return str(rng.randint(0, 99))
    op = rng.choice("+-*")
    left, right = _expression(rng, depth + 1), _expression(rng, depth + 1)
    return f"({left} {op} {right})" if depth else f"{left} {op} {right}"


def _conversation(rng: random.Random) -> tuple[list[dict], list[dict] | None]:
    kind = rng.choice(("math", "qa", "agent", "prose"))
    if kind == "math":
        expr = _expression(rng)
        steps = " ".join(f"{rng.randint(0, 999)} {rng.choice('+-*')} {rng.randint(0, 99)} = {rng.randint(0, 9999)}."
                         for _ in range(rng.randint(0, 3)))
        return [{"role": "user", "content": f"Compute {expr}."},
                {"role": "assistant", "content": f"{steps} Answer: {rng.randint(-999, 9999)}".strip(),
                 "reasoning_content": steps or None}], None
    if kind == "qa":
        people = [_name(rng) for _ in range(rng.randint(2, 5))]
        facts = " ".join(f"{p} {rng.choice(('lives in', 'owns', 'likes'))} {_name(rng)}." for p in people)
        return [{"role": "system", "content": f"Facts: {facts}"},
                {"role": "user", "content": f"Where does {rng.choice(people)} live?"},
                {"role": "assistant", "content": f"Answer: {_name(rng)}"}], None
    if kind == "agent":
        tools = [{"type": "function", "function": {"name": name, "description": f"{name} a value",
                                                   "parameters": {"type": "object",
                                                                  "properties": {"key": {"type": "string"}}}}}
                 for name in rng.sample(("lookup", "add", "wait", "search", "read", "multiply"), 2)]
        calls = [{"type": "function", "function": {"name": rng.choice(tools)["function"]["name"],
                                                   "arguments": json.dumps({"key": _name(rng)})}}
                 for _ in range(rng.randint(1, 3))]
        return [{"role": "user", "content": f"Find the {rng.choice(_WORDS)} of {_name(rng)}."},
                {"role": "assistant", "content": "", "tool_calls": calls},
                {"role": "tool", "content": str(rng.randint(0, 9999))},
                {"role": "assistant", "content": f"Answer: {rng.randint(0, 9999)}"}], tools
    words = " ".join(rng.choice(_WORDS) if rng.random() < 0.7 else _name(rng) for _ in range(rng.randint(5, 30)))
    return [{"role": "user", "content": words.capitalize() + "?"},
            {"role": "assistant", "content": words + "."}], None


def corpus(template: str, seed: int = 0, size: int = 20_000) -> Iterator[str]:
    """Rendered chats: two thirds demonstrations of the built-in tasks (so their words are whole tokens), one third
    generic conversations."""
    from forge.rollout.tasks import DOMAINS
    from forge.rollout.tasks.demonstrations import demonstration

    rng = random.Random(seed)
    shown = 0
    for index in range(size):
        if index % 3:
            messages, tools = demonstration(DOMAINS[shown % len(DOMAINS)], rng, index)
            shown += 1
        else:
            messages, tools = _conversation(rng)
        messages = [{k: v for k, v in m.items() if v is not None} for m in messages]
        yield render_chat(template, messages, tools=tools)


def train(template: str, vocab_size: int = VOCAB_SIZE, seed: int = 0) -> _HFTokenizer:
    tokenizer = _HFTokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(CONTROL_TOKENS) - len(MARKUP_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(template, seed), trainer=trainer)
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in CONTROL_TOKENS])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKUP_TOKENS])
    return tokenizer


def tokenizer_config(tokenizer: _HFTokenizer, template: str) -> dict:
    added = {
        str(tokenizer.token_to_id(t)): {"content": t, "special": t in CONTROL_TOKENS, "normalized": False,
                                        "lstrip": False, "rstrip": False, "single_word": False}
        for t in (*CONTROL_TOKENS, *MARKUP_TOKENS)
    }
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "clean_up_tokenization_spaces": False,
        "model_max_length": 2048,
        "chat_template": template,
    }


def build(out_dir: Path = ASSET_DIR, vocab_size: int = VOCAB_SIZE) -> list[Path]:
    """Train the tokenizer and write tokenizer.json and tokenizer_config.json next to chat_template.jinja."""
    out_dir.mkdir(parents=True, exist_ok=True)
    template = (ASSET_DIR / "chat_template.jinja").read_text()
    tokenizer = train(template, vocab_size)
    if tokenizer.get_vocab_size() != vocab_size:
        raise RuntimeError(f"trained {tokenizer.get_vocab_size()} tokens, wanted {vocab_size}: enlarge the corpus")
    paths = [out_dir / "tokenizer.json", out_dir / "tokenizer_config.json"]
    tokenizer.save(str(paths[0]), pretty=True)
    paths[1].write_text(json.dumps(tokenizer_config(tokenizer, template), indent=2) + "\n")
    if out_dir != ASSET_DIR:
        (out_dir / "chat_template.jinja").write_text(template)
        paths.append(out_dir / "chat_template.jinja")
    return paths
