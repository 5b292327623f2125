"""Actor benchmarks, each side by side with its baseline in one run (medians of --repeats runs, and ratios):

1. decode tokens/s at batch 1, 8, 32, 64: the embedded torch engine (eager, and in graph mode: its decode step
   compiled by torch.compile, compile time left out) against transformers' ``generate`` on the same checkpoint
   (sampling, same prompt and output lengths), beside the ceiling of any fp32 engine on these cores: the step's
   matrix multiplications alone;
   and decode at batch 32 with short and long contexts, with the compiled C attention kernel and with torch's
   gather + SDPA path, against transformers;
2. prefill time saved by prefix reuse for 8 rollouts of one long prompt (prefix caching on against off);
3. speculative decoding at batch 1 with the MTP head as draft (on against off), and its acceptance rate; the draft
   head is first distilled from the main head for --distill-steps (as the learner's MTP co-training would);
4. the pause a weight swap causes in decoding (longest gap between steps around a swap against the median gap);
5. a rollout workload: the built-in tasks' prompts sampled until end of sequence or --new-tokens, at most --batch
   at a time: the engine's continuous batching against ``generate`` over successive batches of as many prompts
   (left-padded; each batch runs until its longest answer ends). Tokens/s counts the answers' tokens only.
6. (``--sections vllm``, in an environment with vLLM: ``make test-vllm`` makes one) the torch engine against vLLM's
   CPU build on the same checkpoint: decode tokens/s and tokens per CPU-second at each batch, and the pause a weight
   swap causes in each;
7. (``--sections packing``) the engine with its CPU linear weights packed against the same engine on F.linear
   (``--no-packed-linear``): decode tokens/s at each batch.

Usage: python bench/actor_decode.py [--model tiny|DIR] [--batches 1,8,32,64] [--new-tokens 128] [--repeats 3]
       [--device cpu|cuda]
"""

from __future__ import annotations

import functools
import itertools
import statistics
import tempfile
import time

import click
import torch
from decode_inputs import load, median, prompt_ids

from forge.actors.backend import GenerationRequest
from forge.actors.config import EngineConfig
from forge.actors.engine.cpu_threads import reserve_cpu_threads
from forge.actors.engine.engine import TorchEngine
from forge.model import CausalLM
from forge.sampling.params import SamplingParams


def model_reference(_ctx: click.Context, _param: click.Parameter, value: str) -> str:
    """--model checked up front: 'tiny' or a checkpoint directory (forge.checkpoints.resolve_model)."""
    from forge.checkpoints import ModelNotFound, resolve_model

    try:
        resolve_model(value)
    except ModelNotFound as exc:
        raise click.BadParameter(str(exc)) from exc
    return value


def engine_seconds(model: CausalLM, batch: int, prompt_len: int, new_tokens: int, **config) -> float:
    """Seconds for the engine to generate ``new_tokens`` for each of ``batch`` prompts (prefill included)."""
    engine = TorchEngine(model, EngineConfig(kv_cache_bytes=256 * 2**20, **config))
    try:
        params = [SamplingParams(temperature=1.0, seed=i, max_tokens=new_tokens, ignore_eos=True) for i in range(batch)]
        prompts = [prompt_ids(i, prompt_len) for i in range(batch)]
        started = time.perf_counter()
        streams = [engine.submit(GenerationRequest("", p, s)) for p, s in zip(prompts, params, strict=True)]
        produced = sum(len(c.token_ids) for stream in streams for c in stream)
        assert produced == batch * new_tokens, produced
        return time.perf_counter() - started
    finally:
        engine.close()


def hf_reference(model_name: str, device: str, threads: int):
    """transformers' Qwen3 on the same checkpoint, on ``device``, warmed up (first calls pay one-off costs)."""
    import transformers

    if threads:
        torch.set_num_threads(threads)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    with tempfile.TemporaryDirectory() as directory:
        load(model_name).save_pretrained(directory)
        reference = transformers.Qwen3ForCausalLM.from_pretrained(directory, dtype=torch.float32)
    reference = reference.to(device).eval()
    hf_seconds(reference, 2, 32, 4)
    return reference


def hf_seconds(reference, batch: int, prompt_len: int, new_tokens: int) -> float:
    prompts = torch.tensor([prompt_ids(i, prompt_len) for i in range(batch)], device=reference.device)
    started = time.perf_counter()
    with torch.inference_mode():
        output = reference.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=True,
                                    max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=0, top_k=0,
                                    top_p=1.0)
    output.cpu()                                               # waits for the device
    return time.perf_counter() - started


def measure_decode(side: str, model_name: str, device: str, threads: int, batch: int, new_tokens: int,
                   repeats: int, prompt_len: int = 32, decode_only: bool = False) -> float:
    """Median decode tokens/s of one side, run in a fresh process as a server would run it: the engine's loop thread
    owns the torch threads (``reserve_cpu_threads``); transformers' ``generate`` runs on the main thread.

    Plain: all tokens over all the time, prefill included. ``decode_only``: the difference between a run of
    ``new_tokens`` and one of a quarter as many, which leaves out the prefill (long prompts' cost)."""
    if side == "matmuls":
        torch.set_num_threads(threads)
        return batch / matmul_floor(load(model_name).to(device), batch)
    if side == "transformers":
        reference = hf_reference(model_name, device, threads)
        seconds = functools.partial(hf_seconds, reference, batch, prompt_len)
        return median([_rate(seconds, batch, new_tokens, decode_only) for _ in range(repeats)])
    threads = reserve_cpu_threads(threads)
    model = load(model_name).to(device).eval()
    config = dict(speculative=side == "speculative", threads=threads, cpu_kernels=side != "engine-torch-attention",
                  compile_decode=side == "graph", packed_linear=side != "unpacked")
    engine_seconds(model, 2, 32, 4, **config)                   # warm-up (and graph mode's one compile)
    seconds = functools.partial(engine_seconds, model, batch, prompt_len, **config)
    return median([_rate(seconds, batch, new_tokens, decode_only) for _ in range(repeats)])


def matmul_floor(model, batch: int, repeats: int = 200) -> float:
    """Median seconds of one decode step's matrix multiplications (every projection of every layer and the output
    head) on ``batch`` rows, issued back to back: the floor under any implementation of the step."""
    weights = [m.weight for name, m in model.named_modules()       # an untied lm_head is among them
               if isinstance(m, torch.nn.Linear) and not name.startswith("mtp.")]
    if model.lm_head is None:
        weights.append(model.output_weight)                         # tied: the embedding matrix
    inputs = [torch.randn(batch, w.shape[1], device=w.device, dtype=w.dtype) for w in weights]
    sync = torch.cuda.synchronize if weights[0].is_cuda else lambda: None
    times = []
    with torch.inference_mode():
        for _ in range(repeats):
            sync()
            started = time.perf_counter()
            for x, w in zip(inputs, weights, strict=True):
                torch.nn.functional.linear(x, w)
            sync()
            times.append(time.perf_counter() - started)
    return statistics.median(times)


def _rate(seconds, batch: int, new_tokens: int, decode_only: bool) -> float:
    if not decode_only:
        return batch * new_tokens / seconds(new_tokens=new_tokens)
    short = new_tokens // 4
    return batch * (new_tokens - short) / (seconds(new_tokens=new_tokens) - seconds(new_tokens=short))


def run_sides(sides: tuple[str, ...], *args, **kwargs) -> dict[str, float]:
    """``measure_decode`` for each side, one after another, each in a fresh spawned process."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    rates = {}
    for side in sides:
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            rates[side] = pool.submit(measure_decode, side, *args, **kwargs).result()
    return rates


def decode_section(model_name: str, device: str, threads: int, batches: list[int], new_tokens: int,
                   repeats: int) -> None:
    print(f"\n## Decode tokens/s (sampling, 32-token prompts, {new_tokens} new tokens; each side in a fresh process)")
    print("*matmuls alone*: the step's matrix multiplications with nothing else (``matmul_floor``) as tokens/s, the "
          "ceiling of any fp32 engine on these cores; its ratio to transformers bounds every engine's.")
    print("| batch | forge engine | engine, graph mode | forge + MTP speculation | transformers generate | matmuls alone "
          "| engine / transformers | graph mode / transformers | matmuls alone / transformers |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for batch in batches:
        rates = run_sides(("engine", "graph", "speculative", "transformers", "matmuls"), model_name, device, threads,
                          batch, new_tokens, repeats)
        ours, graph, spec, theirs = rates["engine"], rates["graph"], rates["speculative"], rates["transformers"]
        ceiling = rates["matmuls"]
        print(f"| {batch} | {ours:,.0f} | {graph:,.0f} | {spec:,.0f} | {theirs:,.0f} | {ceiling:,.0f} | "
              f"{ours / theirs:.2f}x | {graph / theirs:.2f}x | {ceiling / theirs:.2f}x |", flush=True)


def packing_section(model_name: str, device: str, threads: int, batches: list[int], new_tokens: int,
                    repeats: int) -> None:
    print(f"\n## Packed linear weights against F.linear (sampling, 32-token prompts, {new_tokens} new tokens; each "
          "side in a fresh process)")
    print("| batch | engine (packed) | engine, --no-packed-linear | packed / F.linear |")
    print("| ---: | ---: | ---: | ---: |")
    for batch in batches:
        rates = run_sides(("engine", "unpacked"), model_name, device, threads, batch, new_tokens, repeats)
        print(f"| {batch} | {rates['engine']:,.0f} | {rates['unpacked']:,.0f} | "
              f"{rates['engine'] / rates['unpacked']:.2f}x |", flush=True)


def context_section(model_name: str, device: str, threads: int, prompt_lens: list[int], new_tokens: int,
                    repeats: int, batch: int = 32) -> None:
    print(f"\n## Decode attention by context (batch {batch}; decode only: {new_tokens} new tokens less {new_tokens // 4},"
          " prefill left out; each side in a fresh process)")
    print("| prompt tokens | engine, C attention | engine, torch attention | transformers generate | C / torch "
          "attention | engine / transformers |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for prompt_len in prompt_lens:
        rates = run_sides(("engine", "engine-torch-attention", "transformers"), model_name, device, threads, batch,
                          new_tokens, repeats, prompt_len, decode_only=True)
        ours, torch_attention, theirs = rates["engine"], rates["engine-torch-attention"], rates["transformers"]
        print(f"| {prompt_len} | {ours:,.0f} | {torch_attention:,.0f} | {theirs:,.0f} | {ours / torch_attention:.2f}x "
              f"| {ours / theirs:.2f}x |", flush=True)


def prefix_section(model: CausalLM, prompt_len: int, repeats: int, threads: int) -> None:
    def prefill_s(caching: bool) -> float:
        engine = TorchEngine(model, EngineConfig(kv_cache_bytes=256 * 2**20, prefix_caching=caching,
                                                 speculative=False, threads=threads))
        try:
            prompt = [(11 * j) % 1000 + 1 for j in range(prompt_len)]
            started = time.perf_counter()
            streams = [engine.submit(GenerationRequest("", prompt, SamplingParams(seed=i, max_tokens=1)))
                       for i in range(8)]
            for stream in streams:
                list(stream)
            return time.perf_counter() - started
        finally:
            engine.close()

    on = median([prefill_s(True) for _ in range(repeats)])
    off = median([prefill_s(False) for _ in range(repeats)])
    print(f"\n## Prefix reuse: 8 rollouts of one {prompt_len}-token prompt (time to all first tokens)")
    print("| prefix caching | seconds |\n| --- | ---: |")
    print(f"| off | {off:.3f} |\n| on | {on:.3f} |")
    print(f"time saved: {100 * (1 - on / off):.0f}% ({off / on:.2f}x faster); the limit is 8x (one prefill for 8)")


def distill_draft(model: CausalLM, steps: int, seq_len: int = 64, batch: int = 16) -> None:
    """Train the MTP head to predict token t+2 as the main model would (top-k KL to its detached distribution)."""
    if steps <= 0 or not len(model.mtp):
        return
    model.mtp.requires_grad_(True)
    optimizer = torch.optim.AdamW(model.mtp.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(0)
    for _ in range(steps):
        ids = torch.randint(1, model.config.vocab_size, (batch, seq_len), generator=generator)
        ids = ids.to(model.output_weight.device)
        with torch.no_grad():
            hidden = model(ids)
            target = model.logits(hidden)[:, 1:-1].log_softmax(-1)   # the main head's prediction of token t+2
        draft = model.mtp_logits(model.mtp_forward(hidden[:, :-2], ids[:, 1:-1])).log_softmax(-1)
        loss = torch.nn.functional.kl_div(draft, target, log_target=True, reduction="batchmean")
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.requires_grad_(False)


def speculative_section(model: CausalLM, new_tokens: int, repeats: int, threads: int) -> None:
    rates = {}
    for speculative in (False, True):
        runs = []
        for _ in range(repeats):
            engine = TorchEngine(model, EngineConfig(kv_cache_bytes=64 * 2**20, speculative=speculative,
                                                            threads=threads))
            params = SamplingParams(temperature=1.0, seed=1, max_tokens=new_tokens, ignore_eos=True)
            started = time.perf_counter()
            produced = sum(len(c.token_ids) for c in engine.submit(GenerationRequest("", list(range(1, 33)), params)))
            runs.append(produced / (time.perf_counter() - started))
            acceptance = engine.stats()["spec_acceptance"]
            engine.close()
        rates[speculative] = (median(runs), acceptance)
    (off, _), (on, acceptance) = rates[False], rates[True]
    print("\n## MTP speculative decoding at batch 1 (sampling at temperature 1)")
    print(f"| speculation | tokens/s |\n| --- | ---: |\n| off | {off:,.0f} |\n| on | {on:,.0f} |")
    print(f"speed-up {on / off:.2f}x at acceptance {acceptance:.1%}")


def swap_section(model: CausalLM, threads: int, swaps: int = 5) -> None:
    # One message per token: each arrival is one step, stamped with the version that ran it.
    engine = TorchEngine(model, EngineConfig(kv_cache_bytes=64 * 2**20, speculative=False, threads=threads,
                                             stream_interval=1))
    state = {k: v.clone() for k, v in model.state_dict().items()}
    params = [SamplingParams(seed=i, max_tokens=1500, ignore_eos=True) for i in range(8)]
    streams = [engine.submit(GenerationRequest("", [1, 2, 3], p)) for p in params]
    arrivals: list[tuple[float, int]] = []
    swap_times = []
    for version in range(1, swaps + 1):
        for _ in range(40):
            chunk = streams[0].get(timeout=60)
            arrivals.append((time.perf_counter(), chunk.weight_versions[0] if chunk.weight_versions else -1))
        swap_times.append(time.perf_counter())
        engine.load_weights(version, state)
    for _ in range(40):
        chunk = streams[0].get(timeout=60)
        arrivals.append((time.perf_counter(), chunk.weight_versions[0] if chunk.weight_versions else -1))
    for stream in streams:
        engine.abort(stream.request_id)
    engine.close()
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(arrivals)]
    swap_gaps = [b[0] - a[0] for a, b in itertools.pairwise(arrivals) if b[1] != a[1]]
    size_mb = sum(t.numel() * t.element_size() for t in state.values()) / 2**20
    print(f"\n## Weight swap pause ({size_mb:.1f} MiB of weights, batch 8 decoding, {swaps} swaps)")
    print(f"median step gap {1e3 * median(gaps):.2f} ms; gap across a swap {1e3 * median(swap_gaps):.2f} ms "
          f"(median), {1e3 * max(swap_gaps):.2f} ms (max); pause = {1e3 * (median(swap_gaps) - median(gaps)):.2f} ms")


def rollout_prompts(model_name: str, count: int) -> list[list[int]]:
    """``count`` prompts of the built-in tasks (reasoning, QA and agent in turn), chat-rendered for the model."""
    import random

    from forge.checkpoints import load_tokenizer
    from forge.rollout.tasks import DOMAINS, make_task

    tokenizer = load_tokenizer(model_name)
    rng = random.Random(0)
    tasks = [make_task(DOMAINS[i % len(DOMAINS)], rng, f"bench-{i}") for i in range(count)]
    return [tokenizer.apply_chat_template(t.messages, t.tools, add_generation_prompt=True) for t in tasks]


def measure_rollout(side: str, model_name: str, device: str, threads: int, batch: int, count: int,
                    new_tokens: int) -> tuple[float, float, float]:
    """(answer tokens/s, mean answer length, MTP acceptance) of one side over the rollout workload, in a fresh
    process; side = engine, engine+mtp (speculative decoding with the checkpoint's MTP head) or transformers."""
    prompts = rollout_prompts(model_name, count)
    if side == "transformers":
        reference = hf_reference(model_name, device, threads)
        eos = list(load(model_name).config.eos_token_ids)
        started, produced = time.perf_counter(), 0
        for first in range(0, count, batch):
            group = prompts[first:first + batch]
            width = max(map(len, group))
            ids = torch.tensor([[0] * (width - len(p)) + p for p in group], device=device)
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in group], device=device)
            with torch.inference_mode():
                out = reference.generate(ids, attention_mask=mask, do_sample=True, max_new_tokens=new_tokens,
                                         eos_token_id=eos, pad_token_id=0, top_k=0, top_p=1.0)
            for row in out[:, width:].tolist():
                ends = [i for i, token in enumerate(row) if token in eos]
                produced += ends[0] + 1 if ends else len(row)
        elapsed = time.perf_counter() - started
        return produced / elapsed, produced / count, 0.0
    threads = reserve_cpu_threads(threads)
    model = load(model_name).to(device).eval()
    speculative = side == "engine+mtp"
    engine = TorchEngine(model, EngineConfig(kv_cache_bytes=256 * 2**20, speculative=speculative, threads=threads,
                                             max_num_seqs=batch))
    try:
        engine_seconds(model, 2, 32, 4, speculative=False, threads=threads)     # warm-up (kernel build)
        started = time.perf_counter()
        streams = [engine.submit(GenerationRequest("", p, SamplingParams(temperature=1.0, max_tokens=new_tokens,
                                                                          seed=i)))
                   for i, p in enumerate(prompts)]
        produced = sum(len(c.token_ids) for stream in streams for c in stream)
        elapsed = time.perf_counter() - started
        acceptance = engine.stats()["spec_acceptance"]
    finally:
        engine.close()
    return produced / elapsed, produced / count, acceptance


def rollout_section(model_name: str, device: str, threads: int, batch: int, count: int, new_tokens: int,
                    repeats: int) -> None:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    lengths = [len(p) for p in rollout_prompts(model_name, count)]
    print(f"\n## Rollout workload: {count} prompts of the built-in tasks ({statistics.mean(lengths):.0f} tokens on "
          f"average, {min(lengths)}-{max(lengths)}), sampled (T = 1) until end of sequence or {new_tokens} tokens, "
          f"{batch} at a time; answer tokens/s, medians of {repeats} (each run in a fresh process)")
    print("| side | answer tokens/s | mean answer tokens |")
    print("| --- | ---: | ---: |")
    rates, acceptances = {}, {}
    names = {"engine": "forge engine (continuous batching)", "engine+mtp": "forge engine + MTP speculation",
             "transformers": "transformers generate (static batches)"}
    for side in names:
        runs = []
        for _ in range(repeats):
            with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
                runs.append(pool.submit(measure_rollout, side, model_name, device, threads, batch, count,
                                        new_tokens).result())
        rates[side] = median([r[0] for r in runs])
        acceptances[side] = median([r[2] for r in runs])
        print(f"| {names[side]} | {rates[side]:,.0f} | {median([r[1] for r in runs]):.1f} |", flush=True)
    print(f"engine / transformers: {rates['engine'] / rates['transformers']:.2f}x; MTP speculation / engine: "
          f"{rates['engine+mtp'] / rates['engine']:.2f}x at acceptance {acceptances['engine+mtp']:.1%}")


@click.command()
@click.option("--model", default="tiny", show_default=True, callback=model_reference)
@click.option("--batches", default="1,8,32,64", show_default=True)
@click.option("--new-tokens", default=128, show_default=True)
@click.option("--prompt-len", default=1024, show_default=True, help="Prompt length of the prefix-reuse section.")
@click.option("--repeats", default=3, show_default=True)
@click.option("--distill-steps", default=300, show_default=True, help="MTP draft distillation before section 3.")
@click.option("--threads", default=0, help="torch threads (0 = all cores)")
@click.option("--context-lens", default="32,1024", show_default=True,
              help="Prompt lengths of the decode-attention section (batch 32).")
@click.option("--sections", default="decode,context,prefix,speculative,swap,rollout", show_default=True)
@click.option("--rollout-batch", default=32, show_default=True, help="Rollout section: sequences decoded at once.")
@click.option("--rollout-prompts", "rollout_count", default=192, show_default=True,
              help="Rollout section: prompts in all.")
@click.option("--device", default="cpu", show_default=True, help="torch device of the model: cpu, cuda, cuda:1")
def main(model: str, batches: str, new_tokens: int, prompt_len: int, repeats: int, distill_steps: int, threads: int,
         context_lens: str, sections: str, rollout_batch: int, rollout_count: int, device: str) -> None:
    threads = reserve_cpu_threads(threads)        # the engines' loops get them; this thread stays single-threaded
    policy = load(model).to(device).eval()
    chosen = set(sections.split(","))
    print(f"model {model}: {sum(p.numel() for p in policy.parameters()) / 1e6:.2f} M parameters; "
          f"torch {torch.__version__}, {threads} threads, device {device}")
    if "decode" in chosen:
        decode_section(model, device, threads, [int(b) for b in batches.split(",")], new_tokens, repeats)
    if "packing" in chosen:
        packing_section(model, device, threads, [int(b) for b in batches.split(",")], new_tokens, repeats)
    if "context" in chosen:
        context_section(model, device, threads, [int(n) for n in context_lens.split(",")], new_tokens, repeats)
    if "prefix" in chosen:
        prefix_section(policy, prompt_len, repeats, threads)
    if "speculative" in chosen:
        distill_draft(policy.train(), distill_steps)
        speculative_section(policy.eval(), new_tokens, repeats, threads)
    if "swap" in chosen:
        swap_section(policy, threads)
    if "rollout" in chosen:
        rollout_section(model, device, threads, rollout_batch, rollout_count, new_tokens, repeats)
    if "vllm" in chosen:
        from actor_vllm import vllm_section

        vllm_section(model, threads, [int(b) for b in batches.split(",")], new_tokens, repeats)


if __name__ == "__main__":
    main()
