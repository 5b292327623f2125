"""The README's main job until ``forge up`` lands (issue #6): the most complete real path that exists today.

It writes the built-in tiny model as an HF-layout checkpoint into the run directory, loads it back, renders a
tool-using conversation with the built-in chat template and samples a reply with the reference decoder, printing
the token ids and their log-probabilities. The weights are freshly initialised (pre-training arrives with #6), so
the reply is noise; what it shows is the path from messages to token ids to sampled tokens.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import click

from forge.builtin import write_tiny_checkpoint
from forge.cli.common import CONTEXT_SETTINGS, setup_logging
from forge.model import CausalLM
from forge.model.generate import generate
from forge.model.sampling import SamplingParams
from forge.tokenizer import Tokenizer

log = logging.getLogger("forge.demo")

MESSAGES = [
    {"role": "system", "content": "Use the tools when they help."},
    {"role": "user", "content": "Compute (12 + 7) * 3."},
]
TOOLS = [{"type": "function", "function": {"name": "add", "description": "Add two integers.",
                                           "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
                                                                                           "b": {"type": "integer"}}}}}]


@click.command(context_settings=CONTEXT_SETTINGS)
@click.option("--run-dir", default="runs/demo", show_default=True, type=click.Path(file_okay=False, path_type=Path))
@click.option("--max-tokens", default=32, show_default=True, type=click.IntRange(1, 512))
@click.option("--seed", default=0, show_default=True)
def main(run_dir: Path, max_tokens: int, seed: int) -> None:
    """Run the most complete real job that exists today on the built-in tiny model."""
    setup_logging()
    checkpoint = run_dir / "checkpoint"
    started = time.perf_counter()
    write_tiny_checkpoint(checkpoint, seed=seed)
    model = CausalLM.from_pretrained(checkpoint).eval()
    tokenizer = Tokenizer.from_dir(checkpoint)
    log.info("wrote and reloaded %s (%.2f M parameters)", checkpoint,
             sum(p.numel() for p in model.parameters()) / 1e6)
    prompt_ids = tokenizer.apply_chat_template(MESSAGES, tools=TOOLS, add_generation_prompt=True)
    log.info("prompt: %d tokens rendered with the built-in chat template", len(prompt_ids))
    out = generate(model, prompt_ids, SamplingParams(temperature=1.0, seed=seed, max_tokens=max_tokens))
    for token, logprob in zip(out.token_ids, out.logprobs, strict=True):
        click.echo(f"  {token:5d} {logprob:8.3f}  {tokenizer.decode([token])!r}")
    log.info("sampled %d tokens (finish: %s) in %.1fs; reply: %r", len(out.token_ids), out.finish_reason,
             time.perf_counter() - started, tokenizer.decode(out.token_ids))


if __name__ == "__main__":
    main()
