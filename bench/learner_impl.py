"""The learner through Forge's own model against the learner through transformers, on the same Qwen3 checkpoint:
tokens per second of one training micro-batch (forward, CISPO loss, backward) on the padded sample-by-sample path,
which both take. The transformers path is what any other family trains through (``forge.model.transformers_policy``);
the ratio says what a family Forge does not implement costs, before prefix-tree merging (which only the native
path has) is counted.

Each repeat times both paths on the same random batch; the table gives medians and their ratio.

Usage: python bench/learner_impl.py [--size small|100m] [--samples 8] [--prompt 256] [--completion 64]
       [--repeats 5] [--json FILE]
"""

from __future__ import annotations

import json
import random
import statistics
import tempfile
import time
from pathlib import Path

import click
import torch

from forge.learner.losses import LossConfig, policy_loss
from forge.learner.policy import policy_forward
from forge.learner.samples import Sample, make_micro_batch
from forge.model import CausalLM
from forge.model.random_checkpoint import SIZES, write_qwen3
from forge.model.transformers_policy import TransformersCausalLM


def batch_of(samples: int, prompt: int, completion: int, vocab: int, seed: int):
    rng = random.Random(seed)
    rows = []
    for i in range(samples):
        tokens = [rng.randrange(3, vocab) for _ in range(prompt + completion)]
        rows.append(Sample(tokens=tokens, prompt_len=prompt, old_logprobs=[-5.0] * completion,
                           versions=[0] * completion, advantage=rng.uniform(-1, 1), temperature=1.0, top_k=0,
                           top_p=1.0, domain="d", position=0, session_id=f"s{i}", call_index=0))
    return make_micro_batch(rows)


def step_seconds(model, batch, config: LossConfig) -> float:
    model.zero_grad(set_to_none=True)
    started = time.perf_counter()
    logprobs = policy_forward(model, batch).logprobs
    policy_loss(config, logprobs, batch.old_logprobs, batch.advantages, torch.ones_like(logprobs),
                batch.sample_index, float(batch.num_tokens), float(len(batch.samples))).backward()
    return time.perf_counter() - started


@click.command()
@click.option("--size", type=click.Choice(sorted(SIZES)), default="small", show_default=True)
@click.option("--samples", default=8, show_default=True)
@click.option("--prompt", default=256, show_default=True)
@click.option("--completion", default=64, show_default=True)
@click.option("--repeats", default=5, show_default=True)
@click.option("--json", "json_out", type=click.Path(dir_okay=False, path_type=Path))
def main(size: str, samples: int, prompt: int, completion: int, repeats: int, json_out: Path | None) -> None:
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as scratch:
        directory = write_qwen3(Path(scratch) / "qwen3", size)
        native = CausalLM.from_pretrained(directory).train()
        through_transformers = TransformersCausalLM.from_pretrained(directory).train()
    config = LossConfig(kind="cispo", eps_high=0.2)
    tokens = samples * (prompt + completion)
    times: dict[str, list[float]] = {"native": [], "transformers": []}
    for repeat in range(repeats + 1):                 # the first repeat warms up and is not counted
        batch = batch_of(samples, prompt, completion, SIZES[size]["vocab_size"], repeat)
        for name, model in (("native", native), ("transformers", through_transformers)):
            seconds = step_seconds(model, batch, config)
            if repeat:
                times[name].append(seconds)
    medians = {name: statistics.median(values) for name, values in times.items()}
    rates = {name: tokens / seconds for name, seconds in medians.items()}
    ratio = rates["transformers"] / rates["native"]
    click.echo(f"Qwen3 {size}, {samples} samples x ({prompt} + {completion}) tokens, float32 on "
               f"{torch.get_num_threads()} threads; median of {repeats}")
    click.echo(f"{'path':<14}{'step s':>10}{'tokens/s':>12}")
    for name in times:
        click.echo(f"{name:<14}{medians[name]:>10.3f}{rates[name]:>12.0f}")
    click.echo(f"transformers / native: {ratio:.2f}x the tokens per second")
    if json_out is not None:
        json_out.write_text(json.dumps({"size": size, "medians_s": medians, "tokens_per_s": rates,
                                        "ratio": ratio}, indent=2))


if __name__ == "__main__":
    main()
