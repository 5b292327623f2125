"""Long trajectories on one learner rank: seconds and peak memory of a training step at 8k to 200k tokens, Forge's
learner against a plain transformers step on the same tokens.

Per context length T: a group of ``--group`` rollouts of one agent call deep in its session, sharing a prompt of
T − ``--completion`` tokens, each with its own completion (the shape of agent RL's long trajectories: one long
transcript, several continuations). The model is the built-in checkpoint with its window stretched to the longest T.
Each case runs in a process of its own, so that its peak resident memory is its own:

- ``forge``: one learner step as the trainer makes it: the group merged into a trie and packed under
  ``--micro-batch-tokens`` (the shared prompt computed once, in stem pieces of at most the budget), the fused
  segments attention, the output head in chunks, CISPO, backward, AdamW;
- ``forge-ckpt``: the same with activation checkpointing (each decoder layer recomputed in the backward);
- ``transformers``: the checkpoint as ``Qwen3ForCausalLM`` with SDPA attention, each rollout a sequence of its own
  (a plain trainer: no prefix sharing), log-probs of the completion only (``logits_to_keep``), the same loss;
- ``transformers-ckpt``: the same with transformers' gradient checkpointing;
- ``forge-ckpt-cp2``, ``forge-ckpt-cp4``: ``forge-ckpt`` with context parallelism, the trees' tokens split across 2
  or 4 processes (torchrun, gloo), each holding the whole model; the slowest rank's seconds and the largest rank's
  memory (the step's stem split across the ranks as the trees are).

Reported per case: seconds per step (median of ``--repeats``), the process's peak resident memory, and what the step
added to it (peak after the steps minus peak once the model was loaded); ratios against ``--baseline``.

``--actor-prompt N`` measures the embedded engine instead: ``--actor-others`` greedy requests decoding, then one
prompt of N tokens arrives (prefilled in chunks of ``--max-batched-tokens``). Reported with the engine's default
``prefill_share`` (its chunks take that share of the time, the others decode in the rest) and with 1 (chunks back to
back): the long prompt's time to first token, and the others' decode tokens per second while it is prefilled
against before it came.

Usage: python bench/long_context.py [--lengths 8192,32768,131072,204800] [--group 2] [--completion 256]
       [--micro-batch-tokens 8192] [--repeats 1] [--cases forge,forge-ckpt,transformers,transformers-ckpt]
       [--baseline transformers] [--json FILE]
       python bench/long_context.py --group 1 --cases forge-ckpt,forge-ckpt-cp2,forge-ckpt-cp4 --baseline forge-ckpt
       python bench/long_context.py --actor-prompt 102400 [--actor-others 8] [--max-batched-tokens 4096]
"""

from __future__ import annotations

import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import click
import torch

from forge.actors.backend import GenerationRequest, RequestStream
from forge.actors.config import EngineConfig
from forge.actors.engine.engine import TorchEngine
from forge.checkpoints import TINY_DIR
from forge.learner.context_parallel import ContextGroup, context_groups
from forge.learner.losses import LossConfig, policy_loss
from forge.learner.parallel import init_distributed
from forge.learner.samples import Sample
from forge.learner.tree import pack_step, sharded_tree_forward, stem_forward, tree_policy_forward
from forge.model import CausalLM
from forge.sampling.params import SamplingParams

CASES = ("forge", "forge-ckpt", "transformers", "transformers-ckpt", "forge-ckpt-cp2", "forge-ckpt-cp4")
LOSS = LossConfig(kind="cispo", eps_high=0.2)


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def stretched_checkpoint(directory: Path, window: int) -> Path:
    """The built-in checkpoint in ``directory`` with its window stretched to ``window`` positions."""
    shutil.copytree(TINY_DIR, directory, dirs_exist_ok=True)
    config = json.loads((directory / "config.json").read_text())
    config["max_position_embeddings"] = window
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    return directory


def group_of(length: int, group: int, completion: int, vocab: int, seed: int = 0) -> list[Sample]:
    """``group`` rollouts sharing a prompt of ``length`` − ``completion`` tokens, each ``length`` tokens long."""
    rng = random.Random(seed)
    prompt = [rng.randrange(3, vocab) for _ in range(length - completion)]
    return [Sample(tokens=prompt + [rng.randrange(3, vocab) for _ in range(completion)], prompt_len=len(prompt),
                   old_logprobs=[-6.0] * completion, versions=[0] * completion, advantage=rng.uniform(-1, 1),
                   temperature=1.0, top_k=0, top_p=1.0, domain="d", position=0, session_id=f"s{i}", call_index=0)
            for i in range(group)]


def forge_step(model: CausalLM, samples: list[Sample], budget: int,
               group: ContextGroup | None = None) -> dict[str, float]:
    """One learner step the trainer's way (global normalisers, one backward per packed tree, then the stem's); with
    ``group``, this rank's share of every tree."""
    tokens = float(sum(s.num_completion for s in samples))
    step = pack_step(samples, budget)
    stem = None if step.stem is None else stem_forward(model, step.stem, piece_tokens=budget, group=group)
    for batch in step.batches:
        out = (sharded_tree_forward(model, batch, group, stem=stem) if group is not None
               else tree_policy_forward(model, batch, stem=stem))
        policy_loss(LOSS, out.logprobs, batch.old_logprobs, batch.advantages, torch.ones_like(out.logprobs),
                    batch.sample_index, tokens, float(len(samples))).backward()
    if stem is not None:
        stem.backward()
    return {"packed_tokens": step.num_nodes, "trees": len(step.batches),
            "stem_pieces": 0 if stem is None else len(stem.pieces)}


def transformers_step(model: torch.nn.Module, samples: list[Sample]) -> dict[str, float]:
    """One step of a plain trainer: each rollout a sequence of its own through SDPA attention, log-probs of its
    completion only, the same CISPO loss."""
    tokens = float(sum(s.num_completion for s in samples))
    for sample in samples:
        ids = torch.tensor([sample.tokens[:-1]])
        count = sample.num_completion
        logits = model(input_ids=ids, logits_to_keep=count).logits[0].float()
        targets = torch.tensor(sample.tokens[sample.prompt_len:])
        logprobs = torch.log_softmax(logits, dim=-1).gather(1, targets[:, None])[:, 0]
        policy_loss(LOSS, logprobs, torch.tensor(sample.old_logprobs), torch.full((count,), sample.advantage),
                    torch.ones(count), torch.zeros(count, dtype=torch.long), tokens, float(len(samples))).backward()
    return {"packed_tokens": sum(len(s.tokens) - 1 for s in samples), "trees": len(samples), "stem_pieces": 0}


def run_case(directory: Path, case: str, length: int, group: int, completion: int, budget: int,
             repeats: int) -> dict:
    """This process: the median step of ``case`` at ``length`` tokens, and its memory."""
    torch.manual_seed(0)
    distributed = None
    if case.startswith("forge"):
        model = CausalLM.from_pretrained(directory).train()
        model.activation_checkpointing("-ckpt" in case)
        step = forge_step
        extra: tuple = (budget,)
        if "-cp" in case:
            distributed = init_distributed("cpu")
            extra = (budget, context_groups(distributed, int(case.rpartition("-cp")[2]))[0])
    else:
        import transformers

        model = transformers.AutoModelForCausalLM.from_pretrained(directory, attn_implementation="sdpa",
                                                                  dtype=torch.float32).train()
        if case.endswith("-ckpt"):
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        step = transformers_step
        extra = ()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    loaded = peak_mb()
    seconds, shape = [], {}
    for repeat in range(repeats):
        samples = group_of(length, group, completion, model.config.vocab_size, seed=repeat)
        started = time.perf_counter()
        shape = step(model, samples, *extra)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        seconds.append(time.perf_counter() - started)
    row = {"case": case, "length": length, "step_s": statistics.median(seconds), "peak_rss_mb": peak_mb(),
           "step_rss_mb": peak_mb() - loaded, "sample_tokens": group * length, **shape}
    if distributed is not None:         # the slowest rank's time, the largest rank's memory
        rows = [None] * distributed.world_size
        torch.distributed.all_gather_object(rows, row)
        row.update({key: max(r[key] for r in rows) for key in ("step_s", "peak_rss_mb", "step_rss_mb")})
        distributed.close()
    return row


def in_process(directory: Path, case: str, length: int, group: int, completion: int, budget: int,
               repeats: int) -> dict:
    """``run_case`` in a fresh interpreter (its own peak memory); a context-parallel case under torchrun."""
    launcher = [sys.executable]
    if "-cp" in case:
        launcher += ["-m", "torch.distributed.run", "--standalone",
                     f"--nproc-per-node={case.rpartition('-cp')[2]}"]
    done = subprocess.run([*launcher, __file__, "--one", f"{directory},{case},{length}", "--group", str(group),
                           "--completion", str(completion), "--micro-batch-tokens", str(budget),
                           "--repeats", str(repeats)], capture_output=True, text=True, check=False)
    if done.returncode:
        return {"case": case, "length": length, "error": done.stderr.strip().splitlines()[-1:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def follow(stream: RequestStream, arrivals: list[tuple[float, int]]) -> None:
    """Note the time and size of every chunk of ``stream`` until it ends."""
    for chunk in stream:
        arrivals.append((time.perf_counter(), len(chunk.token_ids)))


def decoded_between(arrivals: list[list[tuple[float, int]]], start: float, end: float) -> float:
    return sum(n for stream in arrivals for at, n in stream if start <= at < end) / max(end - start, 1e-9)


def actor_case(directory: Path, prompt: int, others: int, budget: int, share: float) -> dict:
    """One engine: ``others`` requests decoding, then a prompt of ``prompt`` tokens; the others' decode rate before
    and while it is prefilled, and its time to first token."""
    per_token = 2 * 5 * 2 * 32 * 4              # K and V, 4 layers and the MTP layer, 2 KV heads of 32, fp32
    config = EngineConfig(kv_cache_bytes=int((prompt + others * 4096) * per_token * 1.2), max_num_seqs=others + 1,
                          max_num_batched_tokens=budget, prefill_share=share, speculative=False,
                          stream_interval=1)
    engine = TorchEngine(CausalLM.from_pretrained(directory), config)
    arrivals: list[list[tuple[float, int]]] = [[] for _ in range(others)]
    try:
        params = SamplingParams(temperature=0, max_tokens=4000, ignore_eos=True)
        streams = [engine.submit(GenerationRequest(f"other-{i}", [5 + i] * 32, params)) for i in range(others)]
        threads = [threading.Thread(target=follow, args=(stream, seen), daemon=True)
                   for stream, seen in zip(streams, arrivals, strict=True)]
        for thread in threads:
            thread.start()
        while min((len(seen) for seen in arrivals), default=1) < 64:    # every other request decoding
            time.sleep(0.05)
        alone_from = time.perf_counter()
        while sum(len(seen) for seen in arrivals) < others * 128:
            time.sleep(0.05)
        arrived = time.perf_counter()
        rng = random.Random(1)
        long_stream = engine.submit(GenerationRequest("long", [rng.randrange(3, 1000) for _ in range(prompt)],
                                                      SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)))
        list(long_stream)
        first_token = time.perf_counter()
        for i in range(others):
            engine.abort(f"other-{i}")
        for thread in threads:
            thread.join(60)
    finally:
        engine.close()
    return {"prefill_share": share, "prompt": prompt, "others": others, "ttft_s": first_token - arrived,
            "others_tok_s_alone": decoded_between(arrivals, alone_from, arrived),
            "others_tok_s_during": decoded_between(arrivals, arrived, first_token)}


def print_actor_table(rows: list[dict]) -> None:
    print("| prefill of the long prompt | its time to first token, s | others' decode tok/s meanwhile "
          "| others' tok/s before it came | meanwhile / before |")
    print("|---|---|---|---|---|")
    for row in rows:
        mode = (f"chunks take {row['prefill_share']:.0%} of the time" if row["prefill_share"] < 1
                else "chunks back to back")
        print(f"| {mode} | {row['ttft_s']:.1f} | {row['others_tok_s_during']:.1f} | "
              f"{row['others_tok_s_alone']:.1f} | {row['others_tok_s_during'] / row['others_tok_s_alone']:.2f}x |")


def print_table(rows: list[dict], lengths: list[int], cases: list[str], baseline: str) -> None:
    by = {(r["case"], r["length"]): r for r in rows}
    print(f"| tokens per rollout | case | packed tokens | s/step | peak RSS MB | step RSS MB | s/step vs {baseline} "
          f"| step RSS vs {baseline} |")
    print("|---|---|---|---|---|---|---|---|")
    for length in lengths:
        base = by.get((baseline, length), {})
        for case in cases:
            row = by.get((case, length))
            if row is None:
                continue
            if "error" in row:
                print(f"| {length:,} | {case} | — | failed: {' '.join(row['error'])} | | | | |")
                continue
            time_ratio = f"{row['step_s'] / base['step_s']:.2f}x" if base.get("step_s") else "—"
            rss_ratio = f"{row['step_rss_mb'] / base['step_rss_mb']:.2f}x" if base.get("step_rss_mb") else "—"
            print(f"| {length:,} | {case} | {row['packed_tokens']:,} | {row['step_s']:.1f} | {row['peak_rss_mb']:,.0f} "
                  f"| {row['step_rss_mb']:,.0f} | {time_ratio} | {rss_ratio} |")


@click.command()
@click.option("--lengths", default="8192,32768,131072,204800", help="Tokens per rollout, comma-separated.")
@click.option("--group", default=2, type=click.IntRange(1), help="Rollouts sharing the prompt.")
@click.option("--completion", default=256, type=click.IntRange(1), help="Tokens of each rollout's completion.")
@click.option("--micro-batch-tokens", "budget", default=8192, type=click.IntRange(16), help="The learner's budget.")
@click.option("--repeats", default=1, type=click.IntRange(1), help="Steps per case (the median is reported).")
@click.option("--cases", default=",".join(CASES), help=f"Comma-separated, of {', '.join(CASES)}.")
@click.option("--baseline", default="transformers", help="The case the ratios are taken against.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), help="Write the rows here.")
@click.option("--actor-prompt", type=click.IntRange(1), help="Measure the engine with a prompt of this many tokens "
                                                              "instead of the learner.")
@click.option("--actor-others", default=8, type=click.IntRange(1), help="Requests decoding when it comes.")
@click.option("--max-batched-tokens", "engine_budget", default=4096, type=click.IntRange(16),
              help="The engine's prefill chunk.")
@click.option("--one", hidden=True, help="Run one case in this process: DIRECTORY,CASE,LENGTH.")
def main(lengths: str, group: int, completion: int, budget: int, repeats: int, cases: str, baseline: str,
         json_path: Path | None, actor_prompt: int | None, actor_others: int, engine_budget: int, one: str | None) -> None:
    if one:
        directory, case, length = one.split(",")
        row = run_case(Path(directory), case, int(length), group, completion, budget, repeats)
        if int(os.environ.get("RANK", "0")) == 0:
            print(json.dumps(row))
        return
    if actor_prompt:
        with tempfile.TemporaryDirectory() as temporary:
            directory = stretched_checkpoint(Path(temporary) / "model", actor_prompt + 8192)
            rows = [actor_case(directory, actor_prompt, actor_others, engine_budget, share)
                    for share in (EngineConfig().prefill_share, 1.0)]
        print(f"the embedded engine, {actor_others} requests decoding, a {actor_prompt:,}-token prompt in chunks of "
              f"{engine_budget:,}, {torch.get_num_threads()} threads")
        print_actor_table(rows)
        if json_path:
            json_path.write_text(json.dumps(rows, indent=2))
        return
    sizes = [int(v) for v in lengths.split(",")]
    chosen = [c for c in cases.split(",") if c]
    if unknown := set(chosen) - set(CASES):
        raise click.BadParameter(f"unknown cases {sorted(unknown)}; choose from {', '.join(CASES)}", param_hint="--cases")
    if min(sizes) <= completion:
        raise click.BadParameter("every length must exceed --completion", param_hint="--lengths")
    rows = []
    with tempfile.TemporaryDirectory() as temporary:
        directory = stretched_checkpoint(Path(temporary) / "model", max(sizes))
        for length in sizes:
            for case in chosen:
                row = in_process(directory, case, length, group, completion, budget, repeats)
                print(json.dumps(row), file=sys.stderr, flush=True)
                rows.append(row)
    print(f"one learner step, {group} rollouts sharing all but their last {completion} tokens, budget {budget:,}, "
          f"{torch.get_num_threads()} threads")
    print_table(rows, sizes, chosen, baseline)
    if json_path:
        json_path.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
