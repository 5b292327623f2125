"""Mixture of experts against a dense model of equal active parameters, side by side in one run (medians of
--repeats, and ratios MoE / dense):

1. ``learner``: training tokens/s of the learner's forward and backward pass (``policy_forward`` and the CISPO loss
   over one padded micro-batch of --sequences × --length tokens, the MoE model replaying a recorded routing as the
   learner does) and the peak memory that pass adds (CUDA: allocated; CPU: the process's resident set), each model
   in a fresh process;
2. ``actor``: the torch engine's decode tokens/s at each of --batches (``bench/actor_decode.py``'s measurement),
   eager and, with ``--graph``, in graph mode as well (the compiled decode step);
3. ``run`` (with --run-minutes): the main job on ``tiny-moe`` twice, with routing replay and with the routers
   choosing again (``[learner] routing``): per run, the median over its steps of the routing mismatch rate (share
   of recorded tokens whose learner routing differs from the actor's), of the importance-ratio statistics, and the
   held-out reward at the start and the end.

Defaults compare ``tiny-moe`` with ``tiny`` (4 experts, top 2, of width 192 against one MLP of 384).

Usage: python bench/moe.py [--moe tiny-moe] [--dense tiny] [--sections learner,actor] [--batches 8,32]
       [--graph] [--repeats 3] [--threads 1] [--device cpu|cuda] [--run-minutes 0]
"""

from __future__ import annotations

import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click
import torch
from actor_decode import measure_decode, model_reference
from decode_inputs import in_fresh_process


def learner_pass(model_name: str, device: str, threads: int, sequences: int, length: int,
                 repeats: int) -> tuple[float, float]:
    """(median training tokens/s, peak MiB the pass adds) of one model, in this process."""
    import random

    from forge.checkpoints import load_model
    from forge.learner.losses import LossConfig, policy_loss
    from forge.learner.policy import policy_forward
    from forge.learner.samples import Sample, make_micro_batch
    from forge.model.moe import routing_of

    torch.set_num_threads(threads)
    model = load_model(model_name, device=device)[0].train()
    rng = random.Random(0)
    prompt = length * 3 // 4
    samples = []
    for _ in range(sequences):
        tokens = [rng.randrange(1, 1000) for _ in range(length)]
        samples.append(Sample(tokens, prompt, [-1.0] * (length - prompt), [0] * (length - prompt),
                              rng.uniform(-1, 1), 1.0, 0, 1.0, "", 0, "", 0))
    if model.config.sparse_layers:                  # the routing an actor would have recorded
        for sample in samples:
            sample.routing = routing_of(model, sample.tokens[:-1])
    batch = make_micro_batch(samples, device)
    config = LossConfig()

    def step() -> None:
        out = policy_forward(model, batch, config.mtp_top_k)
        loss = policy_loss(config, out.logprobs, batch.old_logprobs, batch.advantages, torch.ones_like(out.logprobs),
                           batch.sample_index, float(batch.num_tokens), float(sequences))
        loss = loss + config.mtp_weight * out.mtp_kl.mean()
        loss.backward()
        model.zero_grad(set_to_none=True)

    cuda = device.startswith("cuda")
    before = _resident_mib()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    step()                                           # warm-up, and the peak of one pass
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20 if cuda else _peak_mib() - before
    rates = []
    for _ in range(repeats):
        started = time.perf_counter()
        step()
        if cuda:
            torch.cuda.synchronize()
        rates.append(sequences * length / (time.perf_counter() - started))
    return statistics.median(rates), peak


def _resident_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize() / 2**20


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024       # kilobytes on Linux


def learner_section(models: dict[str, str], device: str, threads: int, sequences: int, length: int,
                    repeats: int) -> dict:
    figures = {kind: in_fresh_process(learner_pass, name, device, threads, sequences, length, repeats)
               for kind, name in models.items()}
    print(f"learner: forward + backward of {sequences} x {length} tokens, {threads} thread(s), {device}")
    print(f"{'model':>10} {'tokens/s':>10} {'peak MiB':>9}")
    for kind, (rate, peak) in figures.items():
        print(f"{models[kind]:>10} {rate:>10.0f} {peak:>9.1f}")
    (moe_rate, moe_peak), (dense_rate, dense_peak) = figures["moe"], figures["dense"]
    print(f"{'MoE/dense':>10} {moe_rate / dense_rate:>9.2f}x {moe_peak / max(dense_peak, 1e-9):>8.2f}x")
    return {kind: {"tokens_per_s": rate, "peak_mib": peak} for kind, (rate, peak) in figures.items()}


def actor_section(models: dict[str, str], device: str, threads: int, batches: list[int], new_tokens: int,
                  repeats: int, graph: bool) -> dict:
    """Decode tokens/s per mode ("engine": eager steps; "graph": the compiled decode step), model and batch."""
    modes = ["engine", "graph"] if graph else ["engine"]
    figures = {mode: {kind: {batch: in_fresh_process(measure_decode, mode, name, device, threads, batch, new_tokens,
                                                     repeats) for batch in batches}
                      for kind, name in models.items()} for mode in modes}
    print(f"actor: torch engine decode tokens/s, {new_tokens} new tokens, {threads} thread(s), {device}")
    print(f"{'mode':>6} {'batch':>6} {models['moe']:>10} {models['dense']:>10} {'MoE/dense':>10}"
          + (f" {'MoE graph/eager':>16}" if graph else ""))
    for mode in modes:
        for batch in batches:
            moe, dense = figures[mode]["moe"][batch], figures[mode]["dense"][batch]
            against_eager = f" {moe / figures['engine']['moe'][batch]:>15.2f}x" if graph else ""
            print(f"{mode:>6} {batch:>6} {moe:>10.0f} {dense:>10.0f} {moe / dense:>9.2f}x{against_eager}")
    return figures


def run_section(model: str, minutes: float, seed: int) -> dict:
    """The main job on ``model`` with routing replay and with recomputed routing."""
    results = {}
    for mode in ("replay", "recompute"):
        with tempfile.TemporaryDirectory(prefix="forge-moe-bench-") as scratch:
            run_file = Path(scratch) / "run.toml"
            run_file.write_text(f'[learner]\nrouting = "{mode}"\n')
            run_dir = Path(scratch) / "run"
            command = [str(Path(sys.executable).parent / "forge"), "up", "--model", model, "--minutes", str(minutes),
                       "--seed", str(seed), "--run-dir", str(run_dir), "--config", str(run_file)]
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"forge up ({mode}) failed:\n{done.stderr[-3000:]}")
            records = [json.loads(line) for line in (run_dir / "learner" / "metrics.jsonl").read_text().splitlines()]
            summary = json.loads((run_dir / "summary.json").read_text())

            def med(key: str, rows: list[dict] = records) -> float:
                values = [r[key] for r in rows if key in r]
                return statistics.median(values) if values else float("nan")

            results[mode] = {"steps": len(records), "routing_mismatch": med("routing_mismatch"),
                             "approx_kl": med("approx_kl"), "ratio_mean": med("ratio_mean"),
                             "clip_frac": med("clip_frac"), "expert_load_max": med("expert_load_max"),
                             "eval_start": summary["eval_start"], "eval_end": summary["eval_end"]}
    print(f"run: forge up --model {model} --minutes {minutes:g}, medians over steps")
    print(f"{'routing':>10} {'steps':>6} {'mismatch':>9} {'approx KL':>10} {'ratio':>7} {'load max':>9}  held-out")
    for mode, r in results.items():
        held = ", ".join(f"{d} {r['eval_start'][d]:.2f}->{r['eval_end'][d]:.2f}" for d in r["eval_start"])
        print(f"{mode:>10} {r['steps']:>6} {r['routing_mismatch']:>9.4f} {r['approx_kl']:>10.2e} "
              f"{r['ratio_mean']:>7.3f} {r['expert_load_max']:>9.2f}  {held}")
    return results


@click.command()
@click.option("--moe", default="tiny-moe", show_default=True, callback=model_reference,
              help="The model with experts.")
@click.option("--dense", default="tiny", show_default=True, callback=model_reference,
              help="The dense model of equal active parameters.")
@click.option("--sections", default="learner,actor", show_default=True,
              type=click.Choice(["learner", "actor", "learner,actor", "actor,learner"]))
@click.option("--batches", default="8,32", show_default=True, help="Actor decode batch sizes.")
@click.option("--new-tokens", default=128, show_default=True, type=click.IntRange(1))
@click.option("--graph", is_flag=True, help="Measure the actor in graph mode (--compile-decode) as well.")
@click.option("--sequences", default=16, show_default=True, type=click.IntRange(1),
              help="Learner micro-batch rows.")
@click.option("--length", default=256, show_default=True, type=click.IntRange(8), help="Learner tokens per row.")
@click.option("--repeats", default=3, show_default=True, type=click.IntRange(1))
@click.option("--threads", default=1, show_default=True, type=click.IntRange(1))
@click.option("--device", default="cpu", show_default=True)
@click.option("--run-minutes", default=0.0, show_default=True, type=click.FloatRange(0),
              help="Also run the main job on --moe for this long with each routing mode (0: skip).")
@click.option("--seed", default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON as well.")
def main(moe: str, dense: str, sections: str, batches: str, new_tokens: int, graph: bool, sequences: int,
         length: int, repeats: int, threads: int, device: str, run_minutes: float, seed: int, as_json: bool) -> None:
    """Mixture of experts against a dense model of equal active parameters."""
    models = {"moe": moe, "dense": dense}
    out: dict = {}
    if "learner" in sections:
        out["learner"] = learner_section(models, device, threads, sequences, length, repeats)
    if "actor" in sections:
        out["actor"] = actor_section(models, device, threads, [int(b) for b in batches.split(",")], new_tokens,
                                     repeats, graph)
    if run_minutes:
        out["run"] = run_section(moe, run_minutes, seed)
    if as_json:
        print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
