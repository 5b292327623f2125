"""LoRA against full fine-tuning on the same Qwen3 checkpoint: what a weight version costs to send and to apply, and
what a learner step costs.

- Bytes per version: the adapter version the learner publishes with ``lora_publish = "adapters"`` (the adapters, the
  MTP draft if any, the scale) against the whole model.
- Publish to applied: one version through the real weight channel (a ``WeightPublisher`` and a ``WeightSubscriber``
  on loopback TCP) into the torch engine, until it serves it; the adapter version is merged by the engine on the way.
  The engine's pause itself (swapping tensors between two steps) is the same for both: it always receives a whole
  model.
- Decode with two runs' adapters: tokens per second of a batch of ``--batch`` greedy requests on one torch engine,
  half naming one run's adapter and half another's (``forge-actor --adapter``: the LoRA side path in every adapted
  projection), against the same batch on the plain weights (what one run's merged weights decode at).
- Learner step: tokens per second of one step (forward, CISPO loss, backward, AdamW) on a group of rollouts, and the
  process's peak resident memory, each mode in a process of its own.

Medians of ``--repeats``; the table gives each side and the ratio (LoRA / full).

Usage: python bench/lora.py [--size small|100m] [--rank 8] [--repeats 5] [--samples 8] [--prompt 256]
       [--completion 64] [--batch 8] [--json FILE]
"""

from __future__ import annotations

import json
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import click
import torch
from learner_impl import samples_of

from forge.actors.backend import GenerationRequest
from forge.actors.config import EngineConfig
from forge.actors.engine.engine import TorchEngine
from forge.checkpoints.random_qwen3 import SIZES, write_qwen3
from forge.learner.lora import LoraConfig, adapter_version, add_adapters, merged_state_dict
from forge.learner.losses import LossConfig, policy_loss
from forge.learner.policy import policy_forward
from forge.learner.samples import make_micro_batch
from forge.model import CausalLM
from forge.sampling.params import SamplingParams
from forge.weights import WeightPublisher, WeightSubscriber


def trained(directory: Path, lora: LoraConfig, seed: int = 1) -> torch.nn.Module:
    """The checkpoint with adapters as training leaves them (B no longer zero)."""
    model = add_adapters(CausalLM.from_pretrained(directory), lora)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if ".lora_B." in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.01)
    return model


def nbytes(state: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


def publish_to_applied(directory: Path, versions: dict[str, dict[str, torch.Tensor]], repeats: int
                       ) -> dict[str, list[float]]:
    """Seconds from publish to the engine serving the version, per mode: alternating versions of each mode, each
    engine fresh from the checkpoint (an adapter version applies to the weights the engine started from)."""
    seconds: dict[str, list[float]] = {mode: [] for mode in versions}
    for mode, state in versions.items():
        engine = TorchEngine(CausalLM.from_pretrained(directory), EngineConfig(kv_cache_bytes=8 * 2**20))
        applied = threading.Event()
        publisher = WeightPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*")

        def apply(version: int, tensors: dict, engine: TorchEngine = engine,
                  applied: threading.Event = applied) -> None:
            engine.load_weights(version, tensors)
            if engine.wait_for_version(version, timeout=600):
                applied.set()

        subscriber = WeightSubscriber(publisher.fetch_endpoint, publisher.announce_endpoint, on_version=apply)
        try:
            for version in range(1, repeats + 2):          # the first warms up and is not counted
                applied.clear()
                started = time.perf_counter()
                publisher.publish(version, state)
                if not applied.wait(600):
                    raise RuntimeError(f"{mode} version {version} was not applied")
                if version > 1:
                    seconds[mode].append(time.perf_counter() - started)
        finally:
            subscriber.close()
            publisher.close()
            engine.close()
    return seconds


def decode_with_adapters(directory: Path, adapters: dict[str, dict[str, torch.Tensor]], batch: int, new_tokens: int,
                         repeats: int) -> dict[str, float]:
    """Median decode tokens per second of ``batch`` greedy requests on one engine: ``plain``, on its weights;
    ``adapters``, the requests spread over the named ``adapters`` (served beside the same weights)."""
    engine = TorchEngine(CausalLM.from_pretrained(directory), EngineConfig(kv_cache_bytes=256 * 2**20,
                                                                           max_num_seqs=batch, prefix_caching=False))
    names = list(adapters)
    try:
        for version, (name, state) in enumerate(adapters.items(), start=1):
            engine.load_adapter(name, version, state)
        params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
        figures: dict[str, list[float]] = {"plain": [], "adapters": []}
        for repeat in range(repeats + 1):                   # the first warms up and is not counted
            for mode in figures:
                started = time.perf_counter()
                streams = [engine.submit(GenerationRequest(
                    "", [1 + (repeat * 7 + i) % 50] * 16, params,
                    adapter=names[i % len(names)] if mode == "adapters" else "")) for i in range(batch)]
                for stream in streams:
                    list(stream)
                if repeat:
                    figures[mode].append(batch * new_tokens / (time.perf_counter() - started))
        return {mode: statistics.median(values) for mode, values in figures.items()}
    finally:
        engine.close()


def learner_step(directory: Path, rank: int, repeats: int, samples: int, prompt: int, completion: int) -> dict:
    """This process: the median step of a full or (rank > 0) LoRA learner, and its peak resident memory."""
    model = CausalLM.from_pretrained(directory).train()
    if rank:
        model = add_adapters(model, LoraConfig(rank=rank))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    config = LossConfig(kind="cispo", eps_high=0.2)
    times = []
    for repeat in range(repeats + 1):
        batch = make_micro_batch(samples_of(samples, prompt, completion, model.config.vocab_size, repeat), "cpu")
        started = time.perf_counter()
        logprobs = policy_forward(model, batch).logprobs
        policy_loss(config, logprobs, batch.old_logprobs, batch.advantages, torch.ones_like(logprobs),
                    batch.sample_index, float(batch.num_tokens), float(len(batch.samples))).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if repeat:
            times.append(time.perf_counter() - started)
    return {"step_s": statistics.median(times), "tokens_per_s": samples * (prompt + completion) / statistics.median(times),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


@click.command()
@click.option("--size", type=click.Choice(sorted(SIZES)), default="small", show_default=True)
@click.option("--rank", default=8, show_default=True)
@click.option("--repeats", default=5, show_default=True)
@click.option("--samples", default=8, show_default=True)
@click.option("--prompt", default=256, show_default=True)
@click.option("--completion", default=64, show_default=True)
@click.option("--batch", default=8, show_default=True, help="Requests decoded together with two runs' adapters.")
@click.option("--json", "json_out", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--learner-only", type=click.Path(path_type=Path),
              help="Only time learner steps on the checkpoint in this directory (--rank 0: full), in this process.")
def main(size: str, rank: int, repeats: int, samples: int, prompt: int, completion: int, batch: int,
         json_out: Path | None, learner_only: Path | None) -> None:
    if learner_only is not None:
        click.echo(json.dumps(learner_step(learner_only, rank, repeats, samples, prompt, completion)))
        return
    lora = LoraConfig(rank=rank)
    with tempfile.TemporaryDirectory() as scratch:
        directory = write_qwen3(Path(scratch) / "qwen3", size)
        state = trained(directory, lora).state_dict()
        versions = {"full": merged_state_dict(state, lora), "lora": adapter_version(state, lora)}
        sizes = {mode: nbytes(version) for mode, version in versions.items()}
        applied = {mode: statistics.median(s) for mode, s in publish_to_applied(directory, versions, repeats).items()}
        other = adapter_version(trained(directory, lora, seed=2).state_dict(), lora)
        decode = decode_with_adapters(directory, {"run-a": versions["lora"], "run-b": other}, batch, completion,
                                      repeats)
        steps = {}
        for mode, step_rank in (("full", 0), ("lora", rank)):
            done = subprocess.run([sys.executable, __file__, "--learner-only", str(directory), "--rank", str(step_rank),
                                   "--repeats", str(repeats), "--samples", str(samples), "--prompt", str(prompt),
                                   "--completion", str(completion)], capture_output=True, text=True, check=True)
            steps[mode] = json.loads(done.stdout.strip().splitlines()[-1])
    rows = [("bytes per version, MB", sizes["full"] / 1e6, sizes["lora"] / 1e6),
            ("publish to applied, s", applied["full"], applied["lora"]),
            (f"decode tokens/s, batch {batch}", decode["plain"], decode["adapters"]),
            ("learner tokens/s", steps["full"]["tokens_per_s"], steps["lora"]["tokens_per_s"]),
            ("learner peak RSS, MB", steps["full"]["peak_rss_mb"], steps["lora"]["peak_rss_mb"])]
    click.echo(f"Qwen3 {size}, LoRA rank {rank} on {', '.join(lora.targets)}; float32 on "
               f"{torch.get_num_threads()} CPU threads; medians of {repeats}")
    click.echo(f"{'figure':<26}{'full':>12}{'lora':>12}{'lora/full':>12}")
    for label, full, adapted in rows:
        click.echo(f"{label:<26}{full:>12.4g}{adapted:>12.4g}{adapted / full:>11.3f}x")
    if json_out is not None:
        json_out.write_text(json.dumps({"size": size, "rank": rank, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
