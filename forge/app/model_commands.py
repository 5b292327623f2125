"""``forge model``: inspect, create and try checkpoints in the Hugging Face layout."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import click

from forge.cli.common import CONTEXT_SETTINGS, config_option

if TYPE_CHECKING:
    from forge.builtin import ModelRef
    from forge.model import CausalLM
    from forge.tokenizer import Tokenizer

MODEL_HELP = "Checkpoint directory (HF layout: config.json + safetensors), or 'tiny' / 'tiny-moe' for a built-in model."


def _resolve(model: str) -> ModelRef:
    """MODEL resolved; a bad reference is a usage error with the resolver's message."""
    from forge.builtin import ModelNotFound, resolve_model

    try:
        return resolve_model(model)
    except ModelNotFound as exc:
        raise click.BadParameter(str(exc), param_hint="MODEL") from exc


def _load(model: str) -> tuple[CausalLM, Tokenizer, ModelRef]:
    """MODEL's tokenizer and weights (CPU, float32); a checkpoint that cannot be loaded is an error (exit 1)."""
    from forge.builtin import load_model, load_tokenizer

    ref = _resolve(model)
    try:
        tokenizer = load_tokenizer(ref)
        net, _ = load_model(ref)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc
    return net, tokenizer, ref


@click.group("model", context_settings=CONTEXT_SETTINGS)
def model_group() -> None:
    """Inspect, create and try model checkpoints."""


@model_group.command("info")
@config_option
@click.argument("model", default="tiny")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def info(model: str, as_json: bool) -> None:
    """Show the architecture of MODEL (a checkpoint directory, 'tiny' or 'tiny-moe') and its parameter count."""
    import torch

    from forge.model import CausalLM, ModelConfig

    ref = _resolve(model)
    directory = ref.directory
    try:
        config = ModelConfig.from_file(directory)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc
    with torch.device("meta"):
        net = CausalLM(config)
    mtp = sum(p.numel() for p in net.mtp.parameters())
    total = sum(p.numel() for p in net.parameters())
    report = {"path": str(directory), "parameters": total, "mtp_parameters": mtp,
              "has_weights": ref.has_weights, **config.to_hf_dict()}
    if as_json:
        click.echo(json.dumps(report, indent=2, sort_keys=True))
        return
    click.echo(f"{directory}: {total / 1e6:.2f} M parameters ({mtp / 1e6:.2f} M in MTP modules)"
               f"{'' if report['has_weights'] else ', no weights'}")
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "max_position_embeddings", "rope_theta", "tie_word_embeddings",
                "num_nextn_predict_layers"):
        click.echo(f"  {key:26s} {report[key]}")


@model_group.command("init")
@config_option
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
@click.option("--seed", default=0, show_default=True, help="Initialisation seed.")
def init(out: Path, seed: int) -> None:
    """Write the built-in tiny architecture with freshly initialised weights, and its tokenizer, to OUT."""
    from forge.builtin import write_tiny_checkpoint

    write_tiny_checkpoint(out, seed=seed)
    click.echo(f"wrote {out}")


@model_group.command("generate")
@config_option
@click.argument("model")
@click.option("--prompt", required=True, help="User message; rendered with the model's chat template.")
@click.option("--system", default=None, help="Optional system message.")
@click.option("--max-tokens", default=64, show_default=True, type=click.IntRange(1))
@click.option("--temperature", default=0.0, show_default=True, type=click.FloatRange(0, 100),
              help="0 = greedy.")
@click.option("--top-p", default=1.0, show_default=True, type=click.FloatRange(0, 1, min_open=True))
@click.option("--top-k", default=0, show_default=True, type=click.IntRange(0))
@click.option("--seed", default=None, type=click.IntRange(0))
def generate_command(model: str, prompt: str, system: str | None, max_tokens: int, temperature: float, top_p: float,
                     top_k: int, seed: int | None) -> None:
    """Chat once with MODEL using the plain reference decoder (no server), printing the reply and its tokens."""
    from forge.model.generate import generate
    from forge.model.sampling import SamplingParams

    net, tokenizer, _ = _load(model)
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    prompt_ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, seed=seed, max_tokens=max_tokens)
    out = generate(net.eval(), prompt_ids, params)
    click.echo(tokenizer.decode(out.token_ids))
    click.echo(f"[{len(prompt_ids)} prompt tokens, {len(out.token_ids)} generated, finish: {out.finish_reason}, "
               f"mean log-prob {sum(out.logprobs) / len(out.logprobs):.3f}]", err=True)


@model_group.command("eval")
@config_option
@click.argument("model", default="tiny")
@click.option("--domains", default="reasoning,qa,agent", show_default=True)
@click.option("--size", default=48, show_default=True, type=click.IntRange(1, 64), help="Held-out tasks per domain.")
@click.option("--max-tokens", default=48, show_default=True, type=click.IntRange(1))
@click.option("--temperature", default=0.0, show_default=True, type=click.FloatRange(0, 100),
              help="0 = greedy; otherwise SAMPLES seeded episodes per task.")
@click.option("--samples", default=4, show_default=True, type=click.IntRange(1),
              help="Episodes per task when sampling.")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def eval_command(model: str, domains: str, size: int, max_tokens: int, temperature: float, samples: int,
                 as_json: bool) -> None:
    """Held-out reward of MODEL on the built-in tasks (in-process engine, nothing recorded)."""
    import asyncio

    from forge.actors.config import EngineConfig
    from forge.actors.engine.engine import TorchEngine, reserve_cpu_threads
    from forge.app.rollout.evaluate import evaluate_with
    from forge.app.rollout.llm import EngineChat
    from forge.tasks import DOMAINS

    chosen = tuple(d.strip() for d in domains.split(",") if d.strip())
    if set(chosen) - set(DOMAINS):
        raise click.BadParameter(f"domains must be among {', '.join(DOMAINS)}", param_hint="--domains")
    threads = reserve_cpu_threads()
    policy, tokenizer, ref = _load(model)
    engine = TorchEngine(policy, EngineConfig(kv_cache_bytes=64 * 2**20, model_id=ref.model_id, threads=threads))
    try:
        scores = asyncio.run(evaluate_with(EngineChat(engine, tokenizer), chosen, size, max_tokens,
                                           temperature=temperature, samples=samples))
    finally:
        engine.close()
    if as_json:
        click.echo(json.dumps(scores))
        return
    for domain, score in scores.items():
        reading = "greedy" if temperature == 0 else f"{samples} samples per task at T = {temperature:g}"
        click.echo(f"{domain:10s} {score:.3f}  ({size} tasks, {reading})")
