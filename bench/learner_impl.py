"""The learner through Forge's own model against the learner through transformers, on the same Qwen3 checkpoint:
sample tokens per second of one training step (forward, CISPO loss, backward) of a group of rollouts that share
their prompt, trained sample by sample (the padded path) and as one packed prefix tree. The transformers path is
what any other family trains through (``forge.model.transformers_policy``, Forge's attention registered inside
transformers); the ratios say what a family Forge does not implement costs.

Each repeat times every (model, path) pair on the same random batch; the table gives medians and their ratios.

Usage: python bench/learner_impl.py [--size small|100m] [--samples 8] [--prompt 256] [--completion 64]
       [--repeats 5] [--device cpu|cuda] [--json FILE]
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

from forge.checkpoints.random_qwen3 import SIZES, write_qwen3
from forge.learner.losses import LossConfig, policy_loss
from forge.learner.policy import policy_forward
from forge.learner.samples import Sample, make_micro_batch
from forge.learner.tree import pack_trees, tree_policy_forward
from forge.model import CausalLM
from forge.model.transformers_policy import TransformersCausalLM


def samples_of(samples: int, prompt: int, completion: int, vocab: int, seed: int) -> list[Sample]:
    """A group of rollouts of one prompt."""
    rng = random.Random(seed)
    shared = [rng.randrange(3, vocab) for _ in range(prompt)]
    rows = []
    for i in range(samples):
        tokens = shared + [rng.randrange(3, vocab) for _ in range(completion)]
        rows.append(Sample(tokens=tokens, prompt_len=prompt, old_logprobs=[-5.0] * completion,
                           versions=[0] * completion, advantage=rng.uniform(-1, 1), temperature=1.0, top_k=0,
                           top_p=1.0, domain="d", position=0, session_id=f"s{i}", call_index=0))
    return rows


def step_seconds(model, samples: list[Sample], tree: bool, config: LossConfig, device: str) -> float:
    model.zero_grad(set_to_none=True)
    if device == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    if tree:
        (batch,) = pack_trees(samples, 1 << 20, device)
        logprobs = tree_policy_forward(model, batch).logprobs
    else:
        batch = make_micro_batch(samples, device)
        logprobs = policy_forward(model, batch).logprobs
    policy_loss(config, logprobs, batch.old_logprobs, batch.advantages, torch.ones_like(logprobs),
                batch.sample_index, float(batch.num_tokens), float(len(batch.samples))).backward()
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - started


@click.command()
@click.option("--size", type=click.Choice(sorted(SIZES)), default="small", show_default=True)
@click.option("--samples", default=8, show_default=True)
@click.option("--prompt", default=256, show_default=True)
@click.option("--completion", default=64, show_default=True)
@click.option("--repeats", default=5, show_default=True)
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option("--json", "json_out", type=click.Path(dir_okay=False, path_type=Path))
def main(size: str, samples: int, prompt: int, completion: int, repeats: int, device: str,
         json_out: Path | None) -> None:
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as scratch:
        directory = write_qwen3(Path(scratch) / "qwen3", size)
        models = {"native": CausalLM.from_pretrained(directory, device=device).train(),
                  "transformers": TransformersCausalLM.from_pretrained(directory, device=device).train()}
    config = LossConfig(kind="cispo", eps_high=0.2)
    tokens = samples * (prompt + completion)
    pairs = [(name, path) for path in ("padded", "tree") for name in models]
    times: dict[tuple[str, str], list[float]] = {pair: [] for pair in pairs}
    for repeat in range(repeats + 1):                 # the first repeat warms up and is not counted
        group = samples_of(samples, prompt, completion, SIZES[size]["vocab_size"], repeat)
        for name, path in pairs:
            seconds = step_seconds(models[name], group, path == "tree", config, device)
            if repeat:
                times[(name, path)].append(seconds)
    medians = {pair: statistics.median(values) for pair, values in times.items()}
    rates = {pair: tokens / seconds for pair, seconds in medians.items()}
    where = f"{torch.get_num_threads()} threads" if device == "cpu" else torch.cuda.get_device_name()
    click.echo(f"Qwen3 {size}, {samples} rollouts x ({prompt} shared + {completion}) tokens, float32 on {where}; "
               f"median of {repeats}")
    click.echo(f"{'model':<14}{'path':<8}{'step s':>10}{'tokens/s':>12}")
    for name, path in pairs:
        click.echo(f"{name:<14}{path:<8}{medians[(name, path)]:>10.3f}{rates[(name, path)]:>12.0f}")
    ratios = {path: rates[("transformers", path)] / rates[("native", path)] for path in ("padded", "tree")}
    for path, ratio in ratios.items():
        click.echo(f"transformers / native, {path}: {ratio:.2f}x the tokens per second")
    if json_out is not None:
        json_out.write_text(json.dumps({"size": size, "device": device,
                                        "medians_s": {f"{n}/{p}": v for (n, p), v in medians.items()},
                                        "tokens_per_s": {f"{n}/{p}": v for (n, p), v in rates.items()},
                                        "ratios": ratios}, indent=2))


if __name__ == "__main__":
    main()
