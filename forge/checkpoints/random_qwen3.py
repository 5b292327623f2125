"""Random-weight Qwen3 checkpoints of realistic shapes, written by transformers (a dev dependency), for the
benches and the backends' parity tests where no weights can be downloaded. The tiny model's tokenizer files are
copied beside the weights (its vocabulary is smaller than the model's: the engines work on ids, and ids past the
tokenizer's are never produced by it). The command that writes one is ``python -m forge.app.random_checkpoint``.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["SIZES", "write_qwen3"]

# ~100 M parameters (95 M without the tied embedding counted twice): a small but real Qwen3 shape.
SIZES = {
    "100m": dict(vocab_size=32_000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                 num_attention_heads=12, num_key_value_heads=4, head_dim=64, tie_word_embeddings=True),
    "small": dict(vocab_size=1_024, hidden_size=128, intermediate_size=352, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=32, tie_word_embeddings=True),
}


def write_qwen3(directory: str | Path, size: str = "100m", seed: int = 0) -> Path:
    """A Hugging Face Qwen3 checkpoint (fp32, random weights, norms perturbed so that they matter) in
    ``directory``; returns the directory. Reuses one already written there with the same size and seed."""
    import json

    import torch
    import transformers

    from forge.checkpoints import reference

    directory = Path(directory)
    stamp = directory / "forge-random.json"
    wanted = {"size": size, "seed": seed}
    if stamp.exists() and json.loads(stamp.read_text()) == wanted:
        return directory
    torch.manual_seed(seed)
    config = transformers.Qwen3Config(max_position_embeddings=4096, rope_theta=1_000_000.0, torch_dtype="float32",
                                      bos_token_id=1, eos_token_id=2, **SIZES[size])
    model = transformers.Qwen3ForCausalLM(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.add_(torch.randn_like(param) * 0.1)
    model.save_pretrained(directory, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (directory / name).write_bytes((reference.TINY_DIR / name).read_bytes())
    stamp.write_text(json.dumps(wanted))
    return directory
