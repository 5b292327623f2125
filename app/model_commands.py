"""``forge model``: inspect, create, fetch and try checkpoints in the Hugging Face layout. A model named by its
Hugging Face id is fetched into the Hugging Face cache first (``forge.app.model_fetch``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import click

from forge.app.model_check import check_command
from forge.app.model_fetch import fetch_command, fetch_model
from forge.checkpoints import ModelRef, resolve_model
from forge.cli.common import CONTEXT_SETTINGS
from forge.cli.options import settings_command
from forge.rollout.tasks import ALL_DOMAINS, DOMAINS
from forge.settings import Settings, SettingsError, setting

if TYPE_CHECKING:
    from forge.model import CausalLM
    from forge.tokenizer import Tokenizer

MODEL_HELP = ("Checkpoint directory (HF layout: config.json + safetensors), a Hugging Face id (org/name[@revision], "
              "fetched into the Hugging Face cache), or 'tiny' / 'tiny-moe' for a built-in model.")


def _load(model: str) -> tuple[CausalLM, Tokenizer, ModelRef]:
    """MODEL's tokenizer and weights (CPU, float32); a checkpoint that cannot be loaded is an error (exit 1)."""
    from forge.checkpoints import load_model, load_tokenizer

    fetch_model(model)
    ref = resolve_model(model)
    try:
        tokenizer = load_tokenizer(ref)
        net, _ = load_model(ref)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc
    return net, tokenizer, ref


@click.group("model", context_settings=CONTEXT_SETTINGS)
def model_group() -> None:
    """Inspect, create and try model checkpoints."""


@dataclass(frozen=True, kw_only=True)
class InfoConfig(Settings):
    model: str = setting("tiny", argument=True, validate=resolve_model, help=MODEL_HELP)
    as_json: bool = setting(False, flag="json", help="Print machine-readable JSON.")


@settings_command("info", InfoConfig, table="model.info")
def info(config: InfoConfig) -> None:
    """Show the architecture of MODEL (a checkpoint directory, a Hugging Face id, 'tiny' or 'tiny-moe') and its
    parameter count."""
    import torch

    from forge.model import CausalLM, ModelConfig

    directory = fetch_model(config.model)
    ref = resolve_model(config.model)
    try:
        model_config = ModelConfig.from_file(directory)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc
    with torch.device("meta"):
        net = CausalLM(model_config)
    mtp = sum(p.numel() for p in net.mtp.parameters())
    total = sum(p.numel() for p in net.parameters())
    report = {"path": str(directory), "parameters": total, "mtp_parameters": mtp,
              "has_weights": ref.has_weights, **model_config.to_hf_dict()}
    if config.as_json:
        click.echo(json.dumps(report, indent=2, sort_keys=True))
        return
    click.echo(f"{directory}: {total / 1e6:.2f} M parameters ({mtp / 1e6:.2f} M in MTP modules)"
               f"{'' if report['has_weights'] else ', no weights'}")
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "max_position_embeddings", "rope_theta", "tie_word_embeddings",
                "num_nextn_predict_layers"):
        click.echo(f"  {key:26s} {report[key]}")


@dataclass(frozen=True, kw_only=True)
class InitConfig(Settings):
    out: Path = setting(argument=True, path="dir", help="The checkpoint directory to write.")
    seed: int = setting(0, help="Initialisation seed.")


@settings_command("init", InitConfig, table="model.init")
def init(config: InitConfig) -> None:
    """Write the built-in tiny architecture with freshly initialised weights, and its tokenizer, to OUT."""
    from forge.checkpoints import write_tiny_checkpoint

    write_tiny_checkpoint(config.out, seed=config.seed)
    click.echo(f"wrote {config.out}")


@dataclass(frozen=True, kw_only=True)
class GenerateConfig(Settings):
    model: str = setting(argument=True, validate=resolve_model, help=MODEL_HELP)
    prompt: str = setting(help="User message; rendered with the model's chat template.")
    system: str | None = setting(None, help="Optional system message.")
    max_tokens: int = setting(64, min=1, help="Tokens to generate at most.")
    temperature: float = setting(0.0, min=0, max=100, help="Sampling temperature; 0 = greedy.")
    top_p: float = setting(1.0, min=0, min_open=True, max=1, help="Nucleus sampling's probability mass.")
    top_k: int = setting(0, min=0, help="Sample among this many most likely tokens (0: all).")
    seed: int | None = setting(None, min=0, help="Sampling seed [default: random].")


@settings_command("generate", GenerateConfig, table="model.generate")
def generate_command(config: GenerateConfig) -> None:
    """Chat once with MODEL using the plain reference decoder (no server), printing the reply and its tokens."""
    from forge.model.generate import generate
    from forge.sampling.params import SamplingParams

    net, tokenizer, _ = _load(config.model)
    messages = ([{"role": "system", "content": config.system}] if config.system else []) + [
        {"role": "user", "content": config.prompt}]
    prompt_ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    params = SamplingParams(temperature=config.temperature, top_p=config.top_p, top_k=config.top_k,
                            seed=config.seed, max_tokens=config.max_tokens)
    out = generate(net.eval(), prompt_ids, params)
    click.echo(tokenizer.decode(out.token_ids))
    click.echo(f"[{len(prompt_ids)} prompt tokens, {len(out.token_ids)} generated, finish: {out.finish_reason}, "
               f"mean log-prob {sum(out.logprobs) / len(out.logprobs):.3f}]", err=True)


@dataclass(frozen=True, kw_only=True)
class EvalConfig(Settings):
    model: str = setting("tiny", argument=True, validate=resolve_model, help=MODEL_HELP)
    domains: tuple[str, ...] = setting(DOMAINS, separator=",", choices=ALL_DOMAINS,
                                       help="Task domains to evaluate.")
    size: int = setting(48, min=1, max=64, help="Held-out tasks per domain.")
    max_tokens: int = setting(48, min=1, help="Tokens per model call.")
    temperature: float = setting(0.0, min=0, max=100, help="0 = greedy; otherwise SAMPLES seeded episodes per task.")
    samples: int = setting(4, min=1, help="Episodes per task when sampling.")
    as_json: bool = setting(False, flag="json", help="Print machine-readable JSON.")

    def check(self) -> None:
        if not self.domains:
            raise SettingsError("names no domain", "--domains")


@settings_command("eval", EvalConfig, table="model.eval")
def eval_command(config: EvalConfig) -> None:
    """Held-out reward of MODEL on the built-in tasks (in-process engine, nothing recorded)."""
    import asyncio

    from forge.actors.config import EngineConfig
    from forge.actors.engine.cpu_threads import reserve_cpu_threads
    from forge.actors.engine.engine import TorchEngine
    from forge.app.engine_chat import EngineChat
    from forge.rollout.evaluate import evaluate_with

    threads = reserve_cpu_threads()
    policy, tokenizer, ref = _load(config.model)
    engine = TorchEngine(policy, EngineConfig(kv_cache_bytes=64 * 2**20, model_id=ref.model_id, threads=threads))
    try:
        scores = asyncio.run(evaluate_with(EngineChat(engine, tokenizer), config.domains, config.size,
                                           config.max_tokens, temperature=config.temperature,
                                           samples=config.samples))
    finally:
        engine.close()
    if config.as_json:
        click.echo(json.dumps(scores))
        return
    for domain, score in scores.items():
        reading = "greedy" if config.temperature == 0 else \
            f"{config.samples} samples per task at T = {config.temperature:g}"
        click.echo(f"{domain:10s} {score:.3f}  ({config.size} tasks, {reading})")


for _command in (info, init, fetch_command, generate_command, eval_command, check_command):
    model_group.add_command(_command)
