"""``forge model check MODEL``: what to run on a new checkpoint before training it (a Hugging Face id is fetched into
the cache first). It loads it through Forge's
training path and through transformers and compares their log-probs on random sequences (float32), checks that a
prefix tree trains what the samples train one by one, renders the chat template
with tools and a tool call, names the tool-call and reasoning parsers the gateway would use and the actor backends
that serve the family, and exits 0 only if every check holds (1 otherwise, 2 for bad input)."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

import click

from forge.app.model_fetch import fetch_model
from forge.checkpoints import ModelNotFound, ModelRef, is_native, model_type, resolve_model, trainable_model
from forge.cli.options import settings_command
from forge.settings import Settings, setting

PROBE_TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Look a key up.", "parameters": {
    "type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}}}]
PROBE_CHAT = [{"role": "user", "content": "Who owns Bo?"},
              {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {
                  "name": "lookup", "arguments": '{"key": "Bo"}'}}]},
              {"role": "tool", "tool_call_id": "call_1", "content": "Mai"}]


@dataclass(frozen=True, kw_only=True)
class CheckConfig(Settings):
    model: str = setting(argument=True, validate=resolve_model,
                         help="Checkpoint directory (HF layout), a Hugging Face id (org/name[@revision], fetched into "
                              "the Hugging Face cache), or 'tiny' / 'tiny-moe'.")
    as_json: bool = setting(False, flag="json", help="Print one JSON object (ok, logprob_max_abs_diff, ...).")
    sequences: int = setting(4, min=1, max=64, help="Random sequences the log-probs are compared on.")
    length: int = setting(48, min=4, max=4096, help="Tokens per random sequence.")
    # float32 rounding of two implementations over a trained model's sharp logits stays near 1e-5; a real mismatch
    # (a wrong RoPE, norm or head) is orders of magnitude larger
    tolerance: float = setting(1e-4, min=0, help="Largest log-prob difference from transformers that passes.")
    seed: int = setting(0, min=0, help="Seed of the random sequences.")


def _logprob_gap(ref: ModelRef, policy: Any, config: CheckConfig) -> float:
    """The largest |log p| difference between Forge's training path and transformers on random sequences."""
    import torch
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(str(ref.directory), dtype=torch.float32,
                                                     attn_implementation="eager").eval()
    generator = torch.Generator().manual_seed(config.seed)
    ids = torch.randint(0, policy.config.vocab_size, (config.sequences, config.length), generator=generator)
    with torch.no_grad():
        ours = policy.logits(policy(ids)).float().log_softmax(-1)
        theirs = reference(ids).logits.float().log_softmax(-1)
    return float((ours - theirs).abs().max())


def _tree_gap(policy: Any, config: CheckConfig) -> float:
    """The largest difference between the log-probs of samples trained as one packed tree and one by one."""
    import torch

    from forge.learner.policy import policy_forward
    from forge.learner.samples import Sample, make_micro_batch
    from forge.learner.tree import pack_step, tree_policy_forward

    rng = random.Random(config.seed)
    vocab = policy.config.vocab_size
    shared = [rng.randrange(vocab) for _ in range(config.length // 2)]
    samples = []
    for i in range(max(2, config.sequences)):
        completion = [rng.randrange(vocab) for _ in range(4)]
        tokens = shared + [rng.randrange(vocab) for _ in range(i % 3)] + completion
        samples.append(Sample(tokens=tokens, prompt_len=len(tokens) - 4, old_logprobs=[0.0] * 4, versions=[0] * 4,
                              advantage=0.0, temperature=1.0, top_k=0, top_p=1.0, domain="d", position=0,
                              session_id=f"s{i}", call_index=0))
    gap = 0.0
    with torch.no_grad():
        for batch in pack_step(samples, 1 << 16, share=False).batches:
            tree = tree_policy_forward(policy, batch).logprobs
            linear = policy_forward(policy, make_micro_batch(batch.samples)).logprobs
            gap = max(gap, float((tree - linear).abs().max()))
    return gap


def _template(ref: ModelRef) -> tuple[str | None, str, str]:
    """(why the chat template cannot serve tool calls, or None; the tool parser and why; the reasoning parser)."""
    from forge.checkpoints import load_tokenizer
    from forge.parsing.reasoning import pick_reasoning_parser
    from forge.parsing.tools import pick_tool_parser

    try:
        tokenizer = load_tokenizer(ref)
        tokenizer.render_chat(PROBE_CHAT, PROBE_TOOLS, add_generation_prompt=True)
    except ValueError as exc:           # no tokenizer.json, no template, or one that does not render tools
        return str(exc), "none", "none"
    parser, why = pick_tool_parser(tokenizer.chat_template, model_type(ref))
    reasoning, reasoning_why = pick_reasoning_parser(tokenizer.chat_template)
    return None, f"{parser} ({why})", f"{reasoning} ({reasoning_why})"


def _backends(ref: ModelRef) -> list[str]:
    from forge.actors.vllm.factory import vllm_installed

    backends = ["torch (the embedded engine)"] if is_native(ref) else []
    backends.append("vllm" + ("" if vllm_installed() else " (not installed here: pip install vllm)"))
    return backends


@settings_command("check", CheckConfig, table="model.check")
def check_command(config: CheckConfig) -> None:
    """Check that MODEL can be trained and served exactly, before training it."""
    fetch_model(config.model)
    try:
        ref = trainable_model(config.model)
    except ModelNotFound as exc:
        raise click.ClickException(str(exc)) from None
    from transformers.utils import logging as transformers_logging

    from forge.checkpoints import load_model

    transformers_logging.set_verbosity_error()      # its load report lists tensors it ignores (Forge's MTP head)
    transformers_logging.disable_progress_bar()
    try:
        policy, _ = load_model(ref)
    except (ValueError, OSError) as exc:
        raise click.ClickException(f"{config.model} cannot be loaded: {exc}") from None
    policy.eval()
    native = is_native(ref)
    report: dict[str, Any] = {"model": str(ref.directory), "model_type": model_type(ref),
                              "training_path": "forge" if native else "transformers"}
    report["logprob_max_abs_diff"] = _logprob_gap(ref, policy, config)
    report["tree_max_abs_diff"] = _tree_gap(policy, config)
    problem, report["tool_parser"], report["reasoning_parser"] = _template(ref)
    report["chat_template"] = problem or "renders tools and tool calls"
    report["backends"] = _backends(ref)
    failures = [what for what, failed in (
        ("log-probs differ from transformers", report["logprob_max_abs_diff"] > config.tolerance),
        ("a packed tree trains differently", report["tree_max_abs_diff"] > config.tolerance),
        ("the chat template", problem is not None)) if failed]
    report["ok"] = not failures
    if config.as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        tree = f"max |diff| from sample by sample {report['tree_max_abs_diff']:.2e}"
        for line in (f"model        {report['model']} ({report['model_type']}, trained through "
                     f"{report['training_path']})",
                     f"log-probs    max |diff| from transformers {report['logprob_max_abs_diff']:.2e} "
                     f"(tolerance {config.tolerance:g})",
                     f"tree         {tree}", f"template     {report['chat_template']}",
                     f"tool parser  {report['tool_parser']}", f"reasoning    {report['reasoning_parser']}",
                     f"backends     {', '.join(report['backends'])}",
                     "ok" if report["ok"] else "NOT OK: " + "; ".join(failures)):
            click.echo(line)
    if failures:
        raise SystemExit(1)


__all__ = ["CheckConfig", "check_command"]
