"""Prefix-tree merging against sample-by-sample training: forward + backward of one training step (CISPO and the
MTP draft loss) over synthetic agent batches, both under the same token budget per micro-batch.

A batch is G rollouts of one task (a long system prompt shared by all, a task prompt), each a session of up to
``turns`` calls whose prompts extend the previous call's prompt, completion and tool output; some calls rewrite
their history (context management: system prompt + summary + the last turn), which branches the tree.

Figures per configuration: sample tokens and trie tokens (their ratio is the limit of the speed-up), tokens packed
(the nodes the tree path computes: the trie's with the step's stem, which computes the context the cut sequences
share once; with --no-stem, trie tokens plus the ancestors each sequence recomputes as context), the attention work ratio
(Σ over samples of L(L+1)/2 against Σ over packed nodes of depth + 1: the limit for the attention part alone), the
measured times, the speed-up and its share of the limit, and peak memory of both paths (torch.cuda on a GPU; on CPU
the peak of live tensor bytes from the profiler's allocation events).

The linear baseline of the largest configurations takes many minutes on a CPU: with --linear-sample K (automatic
above --linear-cap sample tokens) every K-th micro-batch (they are sorted by length) is timed, and the total is
the timed seconds per modelled FLOP times the modelled FLOPs of all micro-batches, each as it runs (every row
padded to the micro-batch's longest). A micro-batch's cost grows with the square of its length, so scaling by the
count of micro-batches instead would follow whichever lengths the stride happens to hit. The table marks such
rows with ~. With --linear-sample 1 (every micro-batch timed) the bench prints what both estimators would have read
at the stride --linear-cap gives.

Usage: python bench/tree_merge.py [--quick] [--model tiny|medium|wide|DIR] [--groups 4,8,16] [--turns 1,8,32]
       [--system 4096] [--completion 32,128] [--tool 16,96] [--budget 16384] [--repeats 2] [--no-stem]
       [--device auto] [--json FILE]
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import click
import torch

from forge.learner.losses import LossConfig, policy_loss
from forge.learner.policy import policy_forward
from forge.learner.samples import Sample, make_micro_batch, micro_batches
from forge.learner.tree import TreeStep, build_trie, pack_step, stem_forward, tree_policy_forward
from forge.model import CausalLM, ModelConfig

MEDIUM = ModelConfig(vocab_size=32000, hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                     num_attention_heads=8, num_key_value_heads=4, head_dim=64, num_nextn_predict_layers=1)
# Wide and shallow (39.6 M parameters): per token its matmuls cost as much as attention over ~6k keys, so at this
# bench's contexts its cost follows the token count, as a 7B model's does up to ~24k keys; sized to run on a CPU.
WIDE = ModelConfig(vocab_size=1024, hidden_size=1024, intermediate_size=2816, num_hidden_layers=2,
                   num_attention_heads=16, num_key_value_heads=8, head_dim=64, num_nextn_predict_layers=1)


def load(name: str, device: str) -> CausalLM:
    from forge.checkpoints import load_model

    if name in ("medium", "wide"):
        model = CausalLM(MEDIUM if name == "medium" else WIDE)
        model.init_weights(seed=0)
    else:
        model, _ = load_model(name)
    return model.to(device).train()


def model_reference(_ctx: click.Context, _param: click.Parameter, value: str) -> str:
    """--model checked up front: medium, wide, or what forge.checkpoints.resolve_model accepts."""
    from forge.checkpoints import ModelNotFound, resolve_model

    if value in ("medium", "wide"):
        return value
    try:
        resolve_model(value)
    except ModelNotFound as exc:
        raise click.BadParameter(str(exc)) from exc
    return value


def agent_batch(rng: random.Random, group_size: int, turns: int, system_len: int, vocab: int,
                task_len: int = 96, completion: tuple[int, int] = (32, 128), tool: tuple[int, int] = (16, 96),
                rewrite: float = 0.1) -> list[Sample]:
    def tokens(n: int) -> list[int]:
        return [rng.randrange(1, vocab) for _ in range(n)]

    system = tokens(system_len)
    task = system + tokens(task_len)
    samples = []
    for rollout in range(group_size):
        context = list(task)
        for call in range(turns):
            if call and rng.random() < rewrite:
                context = task + tokens(64) + context[-rng.randrange(*tool):]
            answer = tokens(rng.randrange(*completion))
            count = len(answer)
            samples.append(Sample(context + answer, len(context), [rng.uniform(-3.0, -0.05) for _ in range(count)],
                                  [0] * count, rng.uniform(-1.0, 1.0), 1.0, 0, 1.0, "bench", 0, f"r{rollout}", call))
            context = context + answer + tokens(rng.randrange(*tool))
    return samples


@dataclass
class Row:
    groups: int
    turns: int
    samples: int
    sample_tokens: int
    trie_tokens: int
    packed_tokens: int          # nodes computed: trie tokens (+ ancestors each batch recomputes, without a stem)
    tree_batches: int
    linear_batches: int
    limit: float                # sample tokens / trie tokens
    packed_limit: float         # sample tokens / packed tokens
    attention_limit: float      # attention pairs, linear / tree
    work_limit: float           # modelled FLOPs, linear / tree
    linear_s: float
    linear_sampled: int         # 1: every micro-batch timed; K: every K-th, scaled by modelled work
    linear_batch_s: list[float]  # seconds of each timed micro-batch, longest first
    tree_s: float
    pack_s: float
    recompute_s: float          # the tree path without the stem (each batch recomputes its context); = tree_s
                                # where the step has no stem
    speedup: float
    linear_peak_mib: float
    tree_peak_mib: float
    linear_check: str           # with every micro-batch timed: what sampling at the automatic stride would read


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_bytes(fn: Callable[[], None], device: torch.device) -> float:
    """Peak live tensor bytes while ``fn`` runs, above what was live before."""
    if device.type == "cuda":
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        fn()
        synchronize(device)
        return float(torch.cuda.max_memory_allocated(device) - before)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
    live = peak = 0
    for _, size in events:
        live += size
        peak = max(peak, live)
    return float(peak)


class Step:
    """Forward + backward of a step's micro-batches, linear or tree-packed (no optimizer update)."""

    def __init__(self, model: CausalLM, samples: list[Sample], loss: LossConfig, device: torch.device,
                 impl: str) -> None:
        self.model, self.samples, self.loss, self.device, self.impl = model, samples, loss, device, impl
        self.total_tokens = float(sum(s.num_completion for s in samples))
        self.total_mtp = float(sum(s.num_completion - (s.prompt_len == 1) for s in samples))

    def _backward(self, out, batch) -> None:
        mask = torch.ones_like(out.logprobs)
        loss = policy_loss(self.loss, out.logprobs, batch.old_logprobs, batch.advantages, mask, batch.sample_index,
                           self.total_tokens, float(len(self.samples)))
        if out.mtp_kl is not None:
            loss = loss + self.loss.mtp_weight * out.mtp_kl.sum() / self.total_mtp
        loss.backward()

    def linear(self, groups: list[list[Sample]]) -> list[float]:
        """Seconds of each micro-batch."""
        self.model.zero_grad(set_to_none=True)
        seconds = []
        for group in groups:
            synchronize(self.device)
            started = time.perf_counter()
            batch = make_micro_batch(group, self.device)
            self._backward(policy_forward(self.model, batch, self.loss.mtp_top_k), batch)
            synchronize(self.device)
            seconds.append(time.perf_counter() - started)
        return seconds

    def tree(self, budget: int, share: bool) -> tuple[float, float]:
        """(seconds for the whole step including packing, seconds of packing)."""
        self.model.zero_grad(set_to_none=True)
        synchronize(self.device)
        started = time.perf_counter()
        step = pack_step(self.samples, budget, self.device, share=share)
        packed = time.perf_counter()
        self.tree_step(step)
        return time.perf_counter() - started, packed - started

    def tree_step(self, step: TreeStep) -> None:
        """The stem's forward, every tree's forward and backward, then the stem's backward (the trainer's order)."""
        stem = None if step.stem is None else stem_forward(self.model, step.stem, self.loss.mtp_top_k, self.impl)
        for batch in step.batches:
            out = tree_policy_forward(self.model, batch, self.loss.mtp_top_k, impl=self.impl, stem=stem)
            self._backward(out, batch)
        if stem is not None:
            stem.backward()
        synchronize(self.device)


def work_model(config: ModelConfig) -> tuple[float, float, float]:
    """Forward FLOPs per token (projections and MLP of every layer, the MTP layer and its input projection), per
    attention pair (q·k and p·v in every layer) and per output-head row (main head and the MTP draft's); backward
    scales all three alike."""
    hidden, layers = config.hidden_size, config.num_hidden_layers + config.num_nextn_predict_layers
    heads, kv_heads, head_dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    per_layer = hidden * head_dim * (2 * heads + 2 * kv_heads) + 3 * hidden * config.intermediate_size
    per_token = 2 * (layers * per_layer + config.num_nextn_predict_layers * 2 * hidden * hidden)
    per_row = 2 * hidden * config.vocab_size * (1 + config.num_nextn_predict_layers)
    return float(per_token), float(4 * heads * head_dim * layers), float(per_row)


def linear_work(groups: list[list[Sample]], config: ModelConfig) -> list[float]:
    """Modelled FLOPs of each linear micro-batch as it runs: every row padded to the longest, causal attention over
    each row, an output-head row per completion token."""
    per_token, per_pair, per_row = work_model(config)
    work = []
    for group in groups:
        width = max(len(s.tokens) for s in group)
        work.append(len(group) * (per_token * width + per_pair * width * (width + 1) / 2)
                    + per_row * sum(s.num_completion for s in group))
    return work


def estimator_check(seconds: list[float], work: list[float], stride: int) -> str:
    """With every micro-batch timed: what a stride-``stride`` sample would have read, as a share of the measured
    total, scaled by the count of micro-batches and by modelled work (from offset 0, as the bench samples, and the
    range over all offsets)."""
    total = sum(seconds)
    by_count, by_work = [], []
    for offset in range(min(stride, len(seconds))):
        timed = seconds[offset::stride]
        by_count.append(sum(timed) * len(seconds) / len(timed) / total)
        by_work.append(sum(timed) * sum(work) / sum(work[offset::stride]) / total)
    rates = [t / w * 1e12 for t, w in zip(seconds, work, strict=True)]
    return (f"    timing every {stride}-th micro-batch would read, of the measured {total:.1f} s: count scaling "
            f"{by_count[0]:.3f} ({min(by_count):.3f}-{max(by_count):.3f} over offsets), work scaling {by_work[0]:.3f} "
            f"({min(by_work):.3f}-{max(by_work):.3f}); seconds per modelled TFLOP {min(rates):.1f}-{max(rates):.1f}")


def limits(samples: list[Sample], step: TreeStep, config: ModelConfig) -> tuple[float, float]:
    """(attention-work ratio, total-work ratio) of linear over tree: Σ L(L+1)/2 pairs against Σ (depth + 1) over
    the nodes the tree path computes; then with the per-token work (tokens against computed nodes) and the output
    head (a row per completion token against a row per distinct predicting node) added."""
    per_token, per_pair, per_row = work_model(config)
    linear_pairs = sum(len(s.tokens) * (len(s.tokens) + 1) / 2 for s in samples)
    passes = [b.position_ids for b in step.batches] + ([step.stem.position_ids] if step.stem else [])
    tree_pairs = sum(float((depths + 1).sum()) for depths in passes)
    linear = (per_token * sum(len(s.tokens) for s in samples) + per_pair * linear_pairs
              + per_row * sum(s.num_completion for s in samples))
    tree = (per_token * step.num_nodes + per_pair * tree_pairs
            + per_row * sum(b.logit_nodes.numel() for b in step.batches))
    return linear_pairs / tree_pairs, linear / tree


def measure(model: CausalLM, groups: int, turns: int, args: dict, device: torch.device) -> Row:
    rng = random.Random(groups * 1000 + turns)
    samples = agent_batch(rng, groups, turns, args["system"], model.config.vocab_size, completion=args["completion"],
                          tool=args["tool"])
    budget = args["budget"]
    trie = build_trie([s.tokens for s in samples])
    tree_step = pack_step(samples, budget, device, trie=trie, share=args["stem"])
    batches = tree_step.batches
    linear_groups = list(micro_batches(samples, budget))
    automatic = max(1, math.ceil(trie.num_sample_tokens / args["linear_cap"]))
    stride = args["linear_sample"] or automatic
    timed = linear_groups[::stride]
    step = Step(model, samples, LossConfig(mtp_top_k=32), device, args["impl"])
    step.tree_step(TreeStep(tree_step.stem, batches[:1]))    # warm-up (allocator, kernels, compilation)
    step.linear(linear_groups[:1])
    tree_s, pack_s = min(step.tree(budget, args["stem"]) for _ in range(args["repeats"]))
    recompute_s = tree_s
    if tree_step.stem is not None:
        recompute_s = min(step.tree(budget, False)[0] for _ in range(args["repeats"]))
    linear_batch_s = min((step.linear(timed) for _ in range(args["repeats"])), key=sum)
    work = linear_work(linear_groups, model.config)
    linear_s = sum(linear_batch_s) * sum(work) / sum(work[::stride])
    check = estimator_check(linear_batch_s, work, automatic) if stride == 1 < automatic < len(work) else ""
    tree_peak = linear_peak = math.nan
    if args["memory"]:        # passes run one after another: the step's peak is its largest batch's (with the stem)
        largest = max(batches, key=lambda b: b.num_nodes)
        tree_peak = peak_bytes(lambda: step.tree_step(TreeStep(tree_step.stem, [largest])), device)
        widest = max(linear_groups, key=lambda g: len(g) * max(len(s.tokens) for s in g))
        linear_peak = peak_bytes(lambda: step.linear([widest]), device)
    packed = tree_step.num_nodes
    attention_limit, work_limit = limits(samples, tree_step, model.config)
    return Row(groups, turns, len(samples), trie.num_sample_tokens, trie.num_nodes, packed, len(batches),
               len(linear_groups), trie.compression, trie.num_sample_tokens / packed, attention_limit, work_limit,
               linear_s, stride, linear_batch_s, tree_s, pack_s, recompute_s, linear_s / tree_s,
               linear_peak / 2**20, tree_peak / 2**20, check)


def token_range(_context: click.Context, _param: click.Parameter, text: str) -> tuple[int, int]:
    """A MIN,MAX option's value."""
    try:
        low, high = (int(x) for x in text.split(","))
    except ValueError:
        raise click.BadParameter(f"expected MIN,MAX, got {text!r}") from None
    if not 1 <= low < high:
        raise click.BadParameter(f"expected 1 <= MIN < MAX, got {text!r}")
    return low, high


HEADER = ("  G turns samples  sample tok  trie tok  packed | limit packed  attn  work | linear s   tree s  pack s | "
          "speedup  /limit  /work | no-stem s  speedup | lin MiB  tree MiB")


def print_row(row: Row) -> None:
    sampled = "~" if len(row.linear_batch_s) < row.linear_batches else " "
    print(f"{row.groups:>3} {row.turns:>5} {row.samples:>7} {row.sample_tokens:>11,} {row.trie_tokens:>9,} "
          f"{row.packed_tokens:>7,} | {row.limit:>5.1f} {row.packed_limit:>6.1f} {row.attention_limit:>5.1f} "
          f"{row.work_limit:>5.1f} | {sampled}{row.linear_s:>7.2f} {row.tree_s:>8.2f} {row.pack_s:>7.2f} | "
          f"{row.speedup:>6.1f}x {row.speedup / row.limit:>6.2f} {row.speedup / row.work_limit:>6.2f} | "
          f"{row.recompute_s:>9.2f} {row.linear_s / row.recompute_s:>7.1f}x | "
          f"{row.linear_peak_mib:>7.0f} {row.tree_peak_mib:>9.0f}", flush=True)
    if row.linear_check:
        print(row.linear_check, flush=True)


@click.command()
@click.option("--quick", is_flag=True, help="a small grid that runs in under a minute")
@click.option("--model", "model_name", default="tiny", show_default=True, callback=model_reference,
              help="tiny, medium, wide or a checkpoint dir")
@click.option("--groups", default="4,8,16", show_default=True, help="rollouts per task (G)")
@click.option("--turns", default="1,8,32", show_default=True, help="calls per session")
@click.option("--system", default=4096, show_default=True, help="tokens of the shared system prompt")
@click.option("--completion", default="32,128", show_default=True, callback=token_range,
              help="completion tokens per call, MIN,MAX (MAX excluded)")
@click.option("--tool", default="16,96", show_default=True, callback=token_range,
              help="tool-output tokens after each call, MIN,MAX (MAX excluded)")
@click.option("--budget", default=16384, show_default=True, help="tokens per micro-batch, both paths")
@click.option("--repeats", default=2, show_default=True, help="timed repeats (the minimum is reported)")
@click.option("--linear-sample", default=0, help="time every K-th linear micro-batch (0 = automatic)")
@click.option("--linear-cap", default=300_000, show_default=True,
              help="sample tokens above which the linear path is sampled automatically")
@click.option("--impl", default="auto", show_default=True, help="tree attention: auto, flex, segments, gather or dense")
@click.option("--stem/--no-stem", default=True, show_default=True,
              help="compute the context the packed sequences share once (the step's stem); --no-stem: each "
                   "sequence recomputes it")
@click.option("--memory/--no-memory", default=True, show_default=True, help="measure peak memory")
@click.option("--device", default="auto", show_default=True)
@click.option("--threads", default=1, show_default=True,
              help="torch CPU threads (0 = torch's default); one keeps timings stable on a shared machine")
@click.option("--json", "json_path", default=None, help="also write the rows to this file")
def main(quick: bool, model_name: str, groups: str, turns: str, system: int, completion: tuple[int, int],
         tool: tuple[int, int], budget: int, repeats: int,
         linear_sample: int, linear_cap: int, impl: str, stem: bool, memory: bool, device: str, threads: int,
         json_path: str | None) -> None:
    target = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device)
    if quick:
        groups, turns, system, budget, repeats = "4,8", "1,4", 256, 4096, 1
    if threads and target.type == "cpu":
        torch.set_num_threads(threads)
    model = load(model_name, str(target))
    args = {"system": system, "completion": completion, "tool": tool, "budget": budget, "repeats": repeats,
            "linear_sample": linear_sample, "linear_cap": linear_cap, "impl": impl, "memory": memory,
            "stem": stem}
    print(f"model {model_name} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters), device "
          f"{target}, torch {torch.__version__}, {torch.get_num_threads()} threads, system prompt {system}, "
          f"completions {completion[0]}-{completion[1] - 1}, tool outputs {tool[0]}-{tool[1] - 1}, budget {budget} "
          f"tokens, tree attention {impl}, {'stem' if stem else 'no stem'}")
    print(HEADER)
    rows = []
    for g in (int(x) for x in groups.split(",")):
        for t in (int(x) for x in turns.split(",")):
            rows.append(measure(model, g, t, args, target))
            print_row(rows[-1])
    if json_path:
        with open(json_path, "w") as handle:
            json.dump([asdict(r) for r in rows], handle, indent=1)


if __name__ == "__main__":
    main()
