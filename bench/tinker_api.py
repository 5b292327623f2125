"""What the Tinker API costs: the same work through forge-tinker with the official SDK against Forge's own way of
doing it, repetitions interleaved, medians.

- training: one batch (``--samples`` sequences sharing a ``--prompt``-token prompt, each with its own
  ``--completion`` tokens, cross-entropy on the completions, LoRA rank ``--rank``) as ``forward_backward`` +
  ``optim_step`` through the API (the SDK in ``.venv-tinker``, ``bench/tinker_api_client.py``, against a
  forge-tinker process) and as ``LearnerTraining.forward(..., backward=True)`` + ``optim_step`` called in this
  process on the same batch; tokens/s of each (the batch's input tokens over the step's wall time) and their ratio.
  The target: the API keeps at least 90 % of the direct tokens/s.
- sampling: ``--sample-prompts`` prompts of ``--sample-prompt`` tokens, ``--num-samples`` samples each of
  ``--max-tokens`` tokens (no end-of-sequence stop, so every sample is full length), all at once: through the API
  (``sample`` on the base model, forge-tinker → forge-actor) and through forge-gateway's gRPC ``Generate`` (one
  session per sample, the calls recorded in its pool) in front of the same actor process; samples/s, sampled
  tokens/s and their ratio.

Every process (a forge-tinker per part, one forge-actor and one forge-gateway for sampling, the SDK client) is
started here on free loopback ports and stopped after. ``--model`` is ``tiny`` (the built-in model), ``small`` or
``100m`` (a random Qwen3 written by ``forge.checkpoints.random_qwen3``), or a checkpoint directory. The default,
the tiny model with a batch of 8 x 512 tokens, is a step of 0.6-1 s on one CPU thread: long enough that the forward
and backward passes dominate (the API's fixed cost is ~15-20 ms a step: the SDK's encoding and HTTP, the hand-off
to the training thread, the answered polls), short enough for repetitions on 2 shared cores, where the 100 M model
takes 30-60 s a step. Both sides train on ``--threads`` torch threads (1: two threads on a contended 2-core machine
slow either side 5-10x, erratically). Step CPU seconds are reported beside wall time: the steadier sign, on a shared
machine, of whether the server does more work than the learner alone.

Usage: python bench/tinker_api.py [--parts training,sampling] [--repeats 5] [--samples 8] [--prompt 256]
       [--completion 256] [--json]
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import click
import grpc
import numpy as np
from procfs import cpu_s

from forge.checkpoints.reference import resolve_model
from forge.launch import ServiceProcess
from forge.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc

ROOT = Path(__file__).resolve().parent.parent
CLIENT = Path(__file__).resolve().parent / "tinker_api_client.py"
KEY = "tml-bench"
LEARNING_RATE = 1e-4


def model_path(model: str, root: Path) -> str:
    if model in ("small", "100m"):
        from forge.checkpoints.random_qwen3 import write_qwen3

        return str(write_qwen3(root / f"random-{model}", model))
    return model


def vocab_size(model: str) -> int:
    return json.loads((resolve_model(model).directory / "config.json").read_text())["vocab_size"]


def training_batch(vocab: int, samples: int, prompt: int, completion: int, seed: int = 0) -> list[dict]:
    """``samples`` sequences sharing a prompt, next-token targets, the completions' tokens weighted 1."""
    rng = np.random.default_rng(seed)
    shared = rng.integers(3, vocab - 8, prompt).tolist()
    batch = []
    for _ in range(samples):
        tokens = shared + rng.integers(3, vocab - 8, completion).tolist()
        batch.append({"tokens": tokens[:-1], "targets": tokens[1:],
                      "weights": [0.0] * (prompt - 1) + [1.0] * completion})
    return batch


class SdkClient:
    """``bench/tinker_api_client.py`` in the SDK's environment, driven one repetition at a time."""

    def __init__(self, python: str, spec: dict, base_url: str, directory: Path) -> None:
        path = directory / f"spec-{spec['mode']}.json"
        path.write_text(json.dumps(spec))
        env = {**os.environ, "TINKER_BASE_URL": base_url, "TINKER_API_KEY": KEY, "HF_HUB_OFFLINE": "1",
               "TOKENIZERS_PARALLELISM": "false"}
        self.log = (directory / f"client-{spec['mode']}.log").open("w")
        python = str(Path(python).absolute()) if os.sep in python else python     # it runs in ``directory``
        self.proc = subprocess.Popen([python, str(CLIENT), str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log, text=True, env=env, cwd=directory)
        while self._line() != "ready":
            pass

    def _line(self) -> str:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the SDK client exited ({self.proc.wait()}); see {self.log.name}")
        return line.strip()

    def step(self) -> dict:
        self.proc.stdin.write("step\n")
        self.proc.stdin.flush()
        return json.loads(self._line())

    def close(self) -> None:
        try:
            self.proc.stdin.close()
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()



def start_tinker(root: Path, model: str, threads: int, actor: str | None = None) -> ServiceProcess:
    args = ["--port", "0", "--grpc-port", "0", "--api-key", KEY, "--run-dir", str(root / "tinker-runs"),
            "--base-model", model, "--device", "cpu", "--dtype", "float32", "--log-level", "WARNING",
            "--weights-fetch", "tcp://127.0.0.1:*", "--weights-announce", "tcp://127.0.0.1:*"]
    if actor is not None:
        args += ["--actor", actor]
    return ServiceProcess("tinker", "forge-tinker", args, root, env={"OMP_NUM_THREADS": str(threads)}, timeout_s=300)


def training_part(opts: dict, model: str, root: Path) -> dict:
    import torch

    from forge.learner.tinker.training import LearnerTraining
    from forge.learner.tinker.types import AdamSpec, Datum, LoraSpec

    batch = training_batch(vocab_size(model), opts["samples"], opts["prompt"], opts["completion"])
    tokens = sum(len(d["tokens"]) for d in batch)
    torch.set_num_threads(opts["threads"])
    direct = LearnerTraining(root / "direct-runs", device="cpu", dtype="float32")
    model_id = direct.create_model("bench", model, LoraSpec(rank=opts["rank"], seed=0)).model_id
    data = [Datum(tokens=np.asarray(d["tokens"], dtype=np.int64),
                  inputs={"target_tokens": np.asarray(d["targets"], dtype=np.int64),
                          "weights": np.asarray(d["weights"], dtype=np.float32)}) for d in batch]

    def direct_step() -> tuple[float, float]:
        started, cpu = time.perf_counter(), time.process_time()
        direct.forward(model_id, data, "cross_entropy", None, True)
        direct.optim_step(model_id, AdamSpec(learning_rate=LEARNING_RATE))
        return time.perf_counter() - started, time.process_time() - cpu

    def api_step(client: SdkClient) -> tuple[float, float]:
        pids = (server.proc.pid, client.proc.pid)
        cpu = sum(map(cpu_s, pids))
        seconds = client.step()["seconds"]
        return seconds, sum(map(cpu_s, pids)) - cpu

    direct_step()                                                  # warm-up, as the client does
    server = start_tinker(root, model, opts["threads"])
    try:
        spec = {"mode": "train", "base_model": model, "rank": opts["rank"], "data": batch,
                "learning_rate": LEARNING_RATE}
        client = SdkClient(opts["tinker_python"], spec, server.info["base_url"], root)
        try:
            api, base = [], []
            for _ in range(opts["repeats"]):
                base.append(direct_step())
                api.append(api_step(client))
        finally:
            client.close()
    finally:
        server.stop()
    api_s, base_s = statistics.median(a[0] for a in api), statistics.median(b[0] for b in base)
    return {"tokens": tokens, "api_s": [a[0] for a in api], "direct_s": [b[0] for b in base],
            "api_cpu_s": [a[1] for a in api], "direct_cpu_s": [b[1] for b in base], "api_tokens_s": tokens / api_s,
            "direct_tokens_s": tokens / base_s, "ratio": base_s / api_s}


async def gateway_round(address: str, sessions: list[list[str]], prompts: list[list[int]], max_tokens: int,
                        seed: int) -> dict:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)

        async def one(session: str, prompt: list[int], sample_seed: int) -> int:
            sampling = common_pb2.SamplingParams(temperature=1.0, seed=sample_seed, max_tokens=max_tokens,
                                                 ignore_eos=True)
            count = 0
            async for chunk in stub.Generate(gateway_pb2.SessionGenerateRequest(session_id=session, prompt_ids=prompt,
                                                                                sampling=sampling)):
                count += len(chunk.token_ids)
            return count

        started = time.perf_counter()
        counts = await asyncio.gather(*(one(s, prompt, seed + i * 100 + j)
                                        for i, (group, prompt) in enumerate(zip(sessions, prompts, strict=True))
                                        for j, s in enumerate(group)))
        return {"seconds": time.perf_counter() - started, "samples": len(counts), "tokens": sum(counts)}


async def gateway_sessions(address: str, groups: int, size: int) -> list[list[str]]:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        found = []
        for g in range(groups):
            found.append([(await stub.StartSession(gateway_pb2.StartSessionRequest(
                task_id=f"bench-{g}", group_id=f"bench-{g}", group_size=size))).session.session_id
                for _ in range(size)])
        return found


def sampling_part(opts: dict, model: str, root: Path) -> dict:
    rng = np.random.default_rng(1)
    vocab = vocab_size(model)
    prompts = [rng.integers(3, vocab - 8, opts["sample_prompt"]).tolist() for _ in range(opts["sample_prompts"])]
    started: list[ServiceProcess] = []
    try:
        actor = ServiceProcess("actor", "forge-actor", ["--port", "0", "--model", model, "--threads", "1",
                                                        "--log-level", "WARNING"], root, timeout_s=300)
        started.append(actor)
        gateway = ServiceProcess("gateway", "forge-gateway", [
            "--actor", actor.info["address"], "--pool", str(root / "pool"), "--grpc-port", "0", "--http-port", "0",
            "--log-level", "WARNING"], root, timeout_s=300)
        started.append(gateway)
        started.append(server := start_tinker(root, model, opts["threads"], actor.info["address"]))
        address = gateway.info["grpc_address"]
        sessions = asyncio.run(gateway_sessions(address, len(prompts), opts["num_samples"]))
        spec = {"mode": "sample", "base_model": model, "prompts": prompts, "num_samples": opts["num_samples"],
                "max_tokens": opts["max_tokens"]}
        client = SdkClient(opts["tinker_python"], spec, server.info["base_url"], root)
        try:
            asyncio.run(gateway_round(address, sessions, prompts, opts["max_tokens"], 0))      # warm-up
            api, base = [], []
            for r in range(opts["repeats"]):
                base.append(asyncio.run(gateway_round(address, sessions, prompts, opts["max_tokens"], 1000 * (r + 1))))
                api.append(client.step())
        finally:
            client.close()
    finally:
        for proc in reversed(started):
            proc.stop()

    def rates(rounds: list[dict]) -> tuple[float, float]:
        return (statistics.median(r["samples"] / r["seconds"] for r in rounds),
                statistics.median(r["tokens"] / r["seconds"] for r in rounds))

    (api_sps, api_tps), (base_sps, base_tps) = rates(api), rates(base)
    return {"api": api, "gateway": base, "api_samples_s": api_sps, "api_tokens_s": api_tps,
            "gateway_samples_s": base_sps, "gateway_tokens_s": base_tps, "ratio": api_tps / base_tps}


def report(opts: dict, results: dict) -> None:
    print(f"model {opts['model']}, {opts['repeats']} repetitions, medians; API / Forge: above 1, the API is ahead")
    print(f"{'part':<58} {'API':>12} {'Forge':>12} {'API / Forge':>12}")
    if "training" in results:
        t = results["training"]
        name = (f"training: {opts['samples']} x ({opts['prompt']} + {opts['completion']}) tokens, tok/s "
                "(vs LearnerTraining)")
        print(f"{name:<58} {t['api_tokens_s']:>12,.0f} {t['direct_tokens_s']:>12,.0f} {t['ratio']:>11.3f}x")
        print(f"{'  step s':<58} {statistics.median(t['api_s']):>12.3f} {statistics.median(t['direct_s']):>12.3f}")
        print(f"{'  CPU s a step (forge-tinker + SDK client; this process)':<58} "
              f"{statistics.median(t['api_cpu_s']):>12.3f} {statistics.median(t['direct_cpu_s']):>12.3f}")
    if "sampling" in results:
        s = results["sampling"]
        name = (f"sampling: {opts['sample_prompts']} prompts x {opts['num_samples']} x {opts['max_tokens']} tokens "
                "(vs gateway gRPC)")
        print(f"{name:<58}")
        print(f"{'  samples/s':<58} {s['api_samples_s']:>12,.1f} {s['gateway_samples_s']:>12,.1f} "
              f"{s['api_samples_s'] / s['gateway_samples_s']:>11.3f}x")
        print(f"{'  sampled tok/s':<58} {s['api_tokens_s']:>12,.0f} {s['gateway_tokens_s']:>12,.0f} "
              f"{s['ratio']:>11.3f}x")


@click.command(help=__doc__.split("\n\n")[0])
@click.option("--parts", default="training,sampling", show_default=True, help="Comma-separated: training, sampling.")
@click.option("--model", default="tiny", show_default=True, help="tiny, small, 100m or a checkpoint directory.")
@click.option("--repeats", default=5, show_default=True, help="Timed repetitions of each side (after a warm-up).")
@click.option("--samples", default=8, show_default=True, help="Training: sequences in the batch.")
@click.option("--prompt", default=256, show_default=True, help="Training: tokens of the shared prompt.")
@click.option("--completion", default=256, show_default=True, help="Training: tokens of each completion.")
@click.option("--threads", default=1, show_default=True,
              help="Training: torch threads of forge-tinker and of the in-process learner alike (one is steadier "
                   "on a shared machine).")
@click.option("--rank", default=8, show_default=True, help="Training: LoRA rank.")
@click.option("--sample-prompts", default=8, show_default=True, help="Sampling: prompts per repetition.")
@click.option("--sample-prompt", default=64, show_default=True, help="Sampling: tokens of each prompt.")
@click.option("--num-samples", default=4, show_default=True, help="Sampling: samples of each prompt.")
@click.option("--max-tokens", default=64, show_default=True, help="Sampling: tokens of each sample.")
@click.option("--tinker-python", default=lambda: os.environ.get("FORGE_TINKER_PYTHON",
                                                                str(ROOT / ".venv-tinker" / "bin" / "python")),
              help="Python of an environment with the tinker SDK  [default: .venv-tinker/bin/python]")
@click.option("--dir", "directory", default=None, type=click.Path(file_okay=False, path_type=Path),
              help="Where the temporary run directory goes.")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
def main(parts: str, directory: Path | None, as_json: bool, **opts) -> None:
    chosen = [p.strip() for p in parts.split(",") if p.strip()]
    unknown = set(chosen) - {"training", "sampling"}
    if unknown:
        raise click.BadParameter(f"unknown parts: {', '.join(sorted(unknown))}", param_hint="--parts")
    with tempfile.TemporaryDirectory(dir=directory, prefix="forge-bench-tinker-") as tmp:
        root = Path(tmp)
        model = model_path(opts["model"], root)
        results = {}
        if "training" in chosen:
            results["training"] = training_part(opts, model, root)
        if "sampling" in chosen:
            results["sampling"] = sampling_part(opts, model, root)
        if as_json:
            click.echo(json.dumps({"options": opts, **results}, indent=2))
        else:
            report(opts, results)


if __name__ == "__main__":
    main()
