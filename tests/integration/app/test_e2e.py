"""The main job end to end, short: forge-cache, learner, actor and gateway as real processes, white-box and black-box
agents rolling out the built-in tasks, the learner training on them. Asserts that trajectories flow into the pool
(black-box ones too), that actors' weight versions advance, that every consumed entry was inside the window when
taken, and that the held-out reward (sampled at the training temperature, the policy RL trains) is above its
starting value after a fixed number of learner steps (not of minutes: the outcome must not depend on the machine's
speed), averaged over the three domains (the 10-minute figures per domain are in docs/benchmarks.md). The run is
keyed, as forge up runs by default: no process it starts has a key on its command line, and its services refuse
calls without one. It is logged to experiment trackers ([tracking]) as a team watches a run: an MLflow server the
test starts, TensorBoard's event files and an offline W&B run, each holding the learner's loss and the held-out
reward per domain by step, with the settings of forge up and every service as plain JSON (summary.json's too)."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import threading
from pathlib import Path

import grpc
import httpx
import pytest
from rich.console import Console

from forge import expert_routing
from forge.app.up.config import UpConfig
from forge.app.up.run import report, run
from forge.checkpoints import TINY_DIR, load_model
from forge.pool import PoolReader
from forge.rollout.config import ModelChoice
from forge.rpc import connect
from forge.sampling.wire import sampling_from_proto
from forge.tracking import TrackingConfig
from forge.v1 import actor_pb2_grpc, cache_pb2_grpc, common_pb2, pool_pb2
from forge.weights.curve import load_key_pair

from helpers.engines import full_forward_logprobs
from helpers.families import SERVABLE, with_tiny_tokenizer, write_family
from helpers.mlflow_server import MlflowServer
from helpers.wandb_log import history as wandb_history

STEPS = 30
# Runs that check their calls used a learner version: from the third step on, the learner trains only on samples of
# a version one behind at most, so the pool holds some whatever the machine's speed (a learner left alone may make
# all its steps on the samples of the first weights).
FRESH = {"max_staleness": 1}

pytestmark = [pytest.mark.skipif(not any(TINY_DIR.glob("*.safetensors")),
                                 reason="the pre-trained tiny checkpoint is not in forge/assets/tiny"),
              pytest.mark.xdist_group("serial")]  # forge up runs: one at a time (conftest.SERIAL)


def descendants(pid: int) -> list[int]:
    """Every living process below ``pid`` (read from /proc)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
        except (ValueError, OSError):
            continue
    found, frontier = [], [pid]
    while frontier:
        children = [child for child, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


def inspect_keyed_services(run_dir: Path, seen: dict, stop: threading.Event) -> None:
    """Once forge up has written services.json: every process it started, with its command line; the run's keys;
    and what its gateway, actor and cache answer a call that comes without a key."""
    while not (run_dir / "services.json").exists():
        if stop.wait(0.2):
            return
    services = {s["name"]: s for s in json.loads((run_dir / "services.json").read_text())}
    seen["keys"] = {path.name: path.read_text() for path in (run_dir / "keys").glob("*.key")}
    seen["modes"] = {path.name: path.stat().st_mode & 0o777 for path in (run_dir / "keys").glob("*.key")}
    seen["cmdlines"] = {}
    for pid in descendants(os.getpid()):
        try:
            seen["cmdlines"][pid] = (Path("/proc") / str(pid) / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
    gateway = services["gateway"]["http_address"]
    seen["unkeyed"] = httpx.get(f"{gateway}/v1/models", timeout=30).status_code
    key = next(line for line in seen["keys"]["gateway.key"].splitlines() if not line.startswith("#"))
    seen["keyed"] = httpx.get(f"{gateway}/v1/models", headers={"Authorization": f"Bearer {key}"},
                              timeout=30).status_code
    for name, stub in (("actor-0", actor_pb2_grpc.ActorStub), ("cache", cache_pb2_grpc.CacheStub)):
        with connect(services[name]["address"]) as channel:
            try:
                stub(channel).Stats(common_pb2.StatsRequest(), timeout=30)
                seen[name] = grpc.StatusCode.OK
            except grpc.RpcError as exc:
                seen[name] = exc.code()
    seen["api_key_files"] = {s["name"]: s.get("api_key_file") for s in services.values()}
    seen["metrics"] = {}
    for name, service in services.items():
        url, key_file = service.get("metrics_url"), service.get("api_key_file")
        if url is None:
            continue
        headers = {}
        if key_file:
            service_key = next(line for line in Path(key_file).read_text().splitlines() if not line.startswith("#"))
            headers = {"Authorization": f"Bearer {service_key}"}
        keyed, unkeyed = httpx.get(url, headers=headers, timeout=30), httpx.get(url, timeout=30)
        seen["metrics"][name] = (keyed.status_code, unkeyed.status_code, "forge_uptime_seconds" in keyed.text)


@pytest.mark.timeout(2400)
def test_a_short_forge_up_run_learns(tmp_path, monkeypatch, subprocess_env):
    monkeypatch.setenv("WANDB_MODE", "offline")
    (tmp_path / "mlflow").mkdir()
    mlflow = MlflowServer(tmp_path / "mlflow", subprocess_env)
    # --minutes only bounds a run that would hang; the learner's step count ends it.
    config = UpConfig(run_dir=tmp_path / "run", steps=STEPS, minutes=30.0, blackbox_every=3,
                      domains=("reasoning", "qa", "agent"),
                      tracking=TrackingConfig(trackers=("mlflow", "tensorboard", "wandb"), uri=mlflow.uri,
                                              project="forge-e2e", tags=("e2e",)))
    console = Console(record=True, width=120)
    seen: dict = {}
    stop = threading.Event()
    inspector = threading.Thread(target=inspect_keyed_services, args=(config.run_dir, seen, stop), daemon=True)
    inspector.start()
    try:
        result = asyncio.run(run(config, console))
        check_tracked(config.run_dir, mlflow.uri, result)
    finally:
        stop.set()
        inspector.join(timeout=120)
        mlflow.kill()
    assert set(seen["keys"]) == {"gateway.key", "actor.key", "cache.key"}, seen.get("keys")
    assert set(seen["modes"].values()) == {0o600}
    keys = [line for text in seen["keys"].values() for line in text.splitlines() if not line.startswith("#")]
    assert len(keys) == 3 and all(len(k) >= 32 for k in keys)
    services = [line for line in seen["cmdlines"].values() if "forge-" in line]
    assert len(services) >= 4 and any("--api-key-file" in line for line in services), seen["cmdlines"]
    assert not [line for line in seen["cmdlines"].values() for k in keys if k in line], "a key on a command line"
    assert seen["unkeyed"] == 401 and seen["keyed"] == 200
    assert seen["actor-0"] == seen["cache"] == grpc.StatusCode.UNAUTHENTICATED
    assert seen["api_key_files"]["gateway"] == str(config.run_dir / "keys" / "gateway.key")
    assert seen["metrics"] == {"learner": (200, 200, True), "cache": (200, 401, True), "actor-0": (200, 401, True),
                               "gateway": (200, 401, True)}, seen["metrics"]
    logs = "".join(path.read_text(errors="replace") for path in (config.run_dir / "logs").glob("*.log"))
    assert not [k for k in keys if k in logs + console.export_text(clear=False)], "a key in the logs"
    report(result, console)
    table = console.export_text()
    assert "held-out reward per domain" in table and all(f"{d} " in table for d in ("reasoning", "qa", "agent"))

    with PoolReader(config.run_dir / "pool") as pool:
        stats = pool.stats()
        entries = pool.entries(start=0, limit=100_000)
        consumed = [e for e in entries if e.status == pool_pb2.ENTRY_STATUS_CONSUMED]
        sessions = [pool.get_session(s) for e in consumed for s in e.members]
    assert stats["calls"] > 50 and len(consumed) >= 8
    # Sessions still in play when the run stops end failed, without calls, and their groups may still be consumed.
    blackbox = [s for s in sessions if s.session.metadata.get("agent") == "blackbox"
                and s.session.status == pool_pb2.SESSION_STATUS_COMPLETED]
    assert blackbox and all(s.calls for s in blackbox), "black-box sessions were recorded and trained on"

    records = [json.loads(line) for line in (config.run_dir / "learner" / "metrics.jsonl").read_text().splitlines()]
    assert len({r["step"] for r in records}) >= STEPS and result["learner"].get("version", 0) >= STEPS
    for record in records:
        for position, (head, window) in zip(record["positions"], record["taken_at"], strict=True):
            assert head <= position < head + window, record
    positions = [p for r in records for p in r["positions"]]
    assert len(positions) == len(set(positions))

    start, end = result["eval_start"], result["eval_end"]
    assert set(start) == set(end) == {"reasoning", "qa", "agent"}
    assert all(0.0 <= v <= 1.0 for v in [*start.values(), *end.values()])
    assert all(v > 0.1 for v in start.values()), start       # the shipped checkpoint solves some of every set
    assert sum(end.values()) > sum(start.values()), (start, end)
    assert set(result["eval_greedy_start"]) == set(result["eval_greedy_end"]) == set(start)

    # The weights travelled over CURVE with the run's own keys, and no secret reached a log.
    keys = config.run_dir / "keys" / "weights"
    assert stat.S_IMODE((keys / "actor-0.key_secret").stat().st_mode) == 0o600
    logs = {path.name: path.read_text(errors="replace") for path in (config.run_dir / "logs").glob("*.log")}
    assert "CURVE for 1 client keys" in logs["learner.log"]
    secrets = [load_key_pair(keys / name)[1].decode() for name in ("learner.key_secret", "actor-0.key_secret")]
    assert not [name for name, text in logs.items() for secret in secrets if secret in text]
    assert (config.run_dir / "curves.png").stat().st_size > 10_000
    services = json.loads((config.run_dir / "services.json").read_text())
    assert {s["kind"] for s in services} == {"learner", "cache", "actor", "gateway"}


def check_tracked(run_dir: Path, uri: str, result: dict) -> None:
    """The run in MLflow, TensorBoard and W&B: the learner's loss at every step, the held-out reward per domain at
    the start and the end, the settings as params; and summary.json's settings as plain JSON."""
    from mlflow import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    records = [json.loads(line) for line in (run_dir / "learner" / "metrics.jsonl").read_text().splitlines()]
    last = {r["step"]: r["loss"] for r in records}
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("forge-e2e").experiment_id])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED" and runs[0].info.run_name == "run"
    tracked = runs[0].info.run_id
    loss = {m.step: m.value for m in client.get_metric_history(tracked, "learner/loss")}
    assert loss == pytest.approx(last)
    # The end's reading comes at the step the learner had made by then (it may train on what was queued after).
    for domain in ("reasoning", "qa", "agent"):
        held_out = sorted((m.step, m.value) for m in client.get_metric_history(tracked, f"eval/reward/{domain}"))
        assert [value for _, value in held_out] == pytest.approx([result["eval_start"][domain],
                                                                  result["eval_end"][domain]])
        assert held_out[0][0] == 0 and held_out[1][0] in last and held_out[1][0] >= STEPS
    assert client.get_metric_history(tracked, "rollout/actor_tokens_per_s")
    params = runs[0].data.params
    assert params["services.learner.trainer.lr"] == "0.0002" and params["up.steps"] == str(STEPS)
    assert params["run_dir"] == str(run_dir.resolve()) and runs[0].data.tags["tag.e2e"] == "true"

    events = EventAccumulator(str(run_dir / "tensorboard" / "run"), size_guidance={"scalars": 0})
    events.Reload()
    assert {e.step: e.value for e in events.Scalars("learner/loss")} == pytest.approx(last)
    assert [e.step for e in events.Scalars("eval/reward/qa")] == [0, held_out[1][0]]
    wandb_runs = list((run_dir / "wandb").glob("offline-run-*"))
    assert len(wandb_runs) == 1
    logged = {row["_step"]: row for row in wandb_history(next(wandb_runs[0].glob("*.wandb")))}
    assert {step for step, row in logged.items() if "learner/loss" in row} == set(last)

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["config"]["steps"] == STEPS and summary["config"]["tracking"]["trackers"] == [
        "mlflow", "tensorboard", "wandb"]
    assert summary["services"]["learner"]["trainer"]["lr"] == 2e-4
    assert "<class" not in json.dumps(summary)


@pytest.fixture(scope="module")
def disaggregated_moe(tmp_path_factory) -> tuple[UpConfig, dict]:
    """The main job on tiny-moe with one prefill and one decode actor, stopped by learner steps (its config and
    result): two tests read it, the prefill actor's and the replayed routing's."""
    # Which calls skip the prefill pool by default depends on what the router has heard when they come; with a
    # threshold of one token none can (a prompt's last token is never counted as cached), so every call must be
    # prefilled apart, whatever the machine's speed.
    config = UpConfig(run_dir=tmp_path_factory.mktemp("disaggregated-moe") / "run", model=ModelChoice(path="tiny-moe"),
                      prefill_actors=1, minutes=20.0, steps=4, eval_size=8, eval_samples=1).with_services(
        gateway={"prefill_min_tokens": 1}, learner=FRESH)
    return config, asyncio.run(run(config, Console(record=True, width=120)))


def pool_calls(run_dir: Path) -> list:
    with PoolReader(run_dir / "pool") as pool:
        return [c for e in pool.entries(start=0, limit=100_000) for s in e.members for c in pool.get_session(s).calls]


@pytest.mark.timeout(1800)
def test_forge_up_disaggregated_trains_through_its_prefill_actor(disaggregated_moe):
    """The main job with one prefill and one decode actor, stopped by learner steps: calls go through the prefill
    actor, the learner trains on them, and both actors apply its versions."""
    config, result = disaggregated_moe
    assert result["learner"].get("version", 0) >= 4
    services = {s["name"]: s for s in json.loads((config.run_dir / "services.json").read_text())}
    assert set(services) >= {"actor-0", "actor-prefill-0", "gateway", "cache", "learner"}
    calls = pool_calls(config.run_dir)
    assert calls and max(v for c in calls for v in c.weight_versions) >= 1, "no call used a learner version"
    gateway = result["gateway"]
    assert gateway["prefill_skipped"] == 0 and gateway["prefills"] >= 1, gateway
    # a call whose prefill actor was briefly unreachable is served whole by its decode actor
    assert gateway["prefills"] + gateway["handover_fallbacks"] >= len(calls), (len(calls), gateway)
    logs = {p.name: p.read_text(errors="replace") for p in (config.run_dir / "logs").glob("*.log")}
    assert "applied weight version" in logs["actor-prefill-0.log"]


def assert_calls_recomputed_by_their_checkpoints(run_dir: Path, adapter: str = "") -> None:
    """Every call in RUN_DIR/pool sampled wholly at a version its learner checkpointed (RUN_DIR/learner) carries the
    log-probs that checkpoint's model recomputes (at least one does); each checkpoint holds its adapter, and every
    call names ``adapter``."""
    checkpoints = {int(p.name.split("-")[1]): p for p in (run_dir / "learner" / "checkpoints").glob("step-*")}
    assert checkpoints and all((p / "adapter" / "adapter_model.safetensors").exists() for p in checkpoints.values())
    with PoolReader(run_dir / "pool") as pool:
        calls = [c for e in pool.entries(start=0, limit=100_000) for s in e.members for c in pool.get_session(s).calls]
    assert calls and {c.adapter for c in calls} == {adapter}
    checked = 0
    for version, directory in sorted(checkpoints.items()):
        model = load_model(directory / "model")[0].eval()
        for call in calls:
            if set(call.weight_versions) == {version} and not call.sampling.logit_bias:
                recomputed = full_forward_logprobs(model, list(call.prompt_ids), list(call.completion_ids),
                                                   sampling_from_proto(call.sampling))
                assert recomputed == pytest.approx(list(call.logprobs), abs=2e-4), (version, call.session_id)
                checked += 1
    assert checked >= 1, "no call was sampled wholly at a trained version"


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("publish", ["merged", "adapters"])
def test_forge_up_with_lora_serves_each_version_the_learner_trained(tmp_path, publish):
    """The main job with LoRA adapters, stopped by learner steps: the learner trains adapters only, the actor
    applies each version (sent merged, or as adapters the actor merges), and every call sampled wholly at a version
    carries log-probs equal to that version's checkpoint recomputing them; each checkpoint holds the adapter beside
    the merged model."""
    config = UpConfig(run_dir=tmp_path / "run", minutes=20.0, steps=3, eval_size=8, eval_samples=1).with_services(
        learner={"lora_rank": 4, "lora_publish": publish, "checkpoint_every": 1, "keep_checkpoints": 5,
                 "max_staleness": 0})
    result = asyncio.run(run(config, Console(record=True, width=120)))
    assert result["learner"].get("version", 0) >= 3
    records = [json.loads(line) for line in (config.run_dir / "learner" / "metrics.jsonl").read_text().splitlines()]
    full = sum(p.numel() for p in load_model("tiny")[0].parameters())
    assert records and all(0 < r["trainable_params"] < full / 4 for r in records), records[0]
    assert_calls_recomputed_by_their_checkpoints(config.run_dir)
    actor_log = (config.run_dir / "logs" / "actor-0.log").read_text(errors="replace")
    assert ("weight versions are LoRA adapters" in actor_log) == (publish == "adapters")


@pytest.mark.timeout(1800)
def test_forge_up_trains_two_runs_on_one_actor_each_with_its_adapter(tmp_path):
    """Two LoRA runs sharing one actor (``forge up --run a --run b``), stopped by learner steps: each run's learner
    trains its adapter and publishes it, the actor serves both beside the base, and each run's calls land in its own
    pool, named with its adapter, with the log-probs its own checkpoints recompute."""
    config = UpConfig(run_dir=tmp_path / "run", runs=("a", "b"), minutes=20.0, steps=2, eval_size=8,
                      eval_samples=1).with_services(learner={"lora_rank": 4, "checkpoint_every": 1,
                                                             "keep_checkpoints": 5, "max_staleness": 0})
    result = asyncio.run(run(config, Console(record=True, width=120)))
    assert set(result["runs"]) == {"a", "b"}
    assert json.loads((config.run_dir / "summary.json").read_text())["runs"].keys() == {"a", "b"}
    for name in ("a", "b"):
        assert result["runs"][name]["learner"].get("version", 0) >= 2 and result["runs"][name]["eval_end"]
        assert_calls_recomputed_by_their_checkpoints(config.run_dir / name, adapter=name)
    services = {s["name"] for s in json.loads((config.run_dir / "services.json").read_text())}
    assert {"learner-a", "learner-b", "gateway-a", "gateway-b", "actor-0"} <= services
    actor_log = (config.run_dir / "logs" / "actor-0.log").read_text(errors="replace")
    assert "version 1 of adapter a" in actor_log and "version 1 of adapter b" in actor_log
    for name in ("a", "b"):                 # each run's learner serves its adapters over CURVE, to the actor alone
        assert "CURVE for 1 client keys" in (config.run_dir / "logs" / f"learner-{name}.log").read_text()


@pytest.mark.timeout(1800)
def test_forge_up_on_the_moe_model_trains_with_replayed_routing(disaggregated_moe):
    """The main job on tiny-moe, stopped by learner steps: every recorded call carries the routing of all its
    positions (the prompt's travels with the KV its prefill actor hands over), the learner replays it and reports
    the mismatch and the expert load, and the actors apply its versions."""
    config, result = disaggregated_moe
    assert result["learner"].get("version", 0) >= 4
    calls = pool_calls(config.run_dir)
    assert calls and max(v for c in calls for v in c.weight_versions) >= 1, "no call used a learner version"
    for call in calls:
        ids = expert_routing.decode(call.routed_experts)
        assert ids is not None and len(ids) == len(call.prompt_ids) + len(call.completion_ids) - 1
    records = [json.loads(line) for line in (config.run_dir / "learner" / "metrics.jsonl").read_text().splitlines()]
    assert records and all(0.0 <= r["routing_mismatch"] <= 1.0 and r["routing_recorded_share"] > 0.5
                           and r["expert_load_max"] >= 1.0 for r in records), records


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("model", ["tiny", "tiny-moe", "llama"])
def test_forge_up_on_vllm_actors_trains(tmp_path, model):
    """The main job with vLLM actors, stopped by learner steps: the learner trains on what they sample, and its
    versions reach them (later calls are stamped with them). With experts, vLLM on CPU records no routing: the
    learner routes every token itself and says so. A family Forge does not implement (llama) is served on vLLM
    without asking (--backend auto), trained through transformers with LoRA adapters, which its versions carry
    alone (vLLM merges them), and forge up says which backend it picked."""
    if model == "llama":
        path = str(with_tiny_tokenizer(write_family(tmp_path / "llama", "llama", shape=SERVABLE, vocab_size=1024,
                                                       max_position_embeddings=4096)[0]))
        config = UpConfig(run_dir=tmp_path / "run", model=ModelChoice(path=path), minutes=20.0, steps=6,
                          eval_size=8, eval_samples=1).with_services(
            learner={"lora_rank": 4, "lora_publish": "adapters", **FRESH})
    else:
        config = UpConfig(run_dir=tmp_path / "run", model=ModelChoice(path=model), minutes=20.0, steps=6,
                          eval_size=8, eval_samples=1).with_services(actor={"backend": "vllm"}, learner=FRESH)
    console = Console(record=True, width=120)
    result = asyncio.run(run(config, console))
    if model == "llama":
        assert "actors: vllm (the embedded engine does not implement llama)" in console.export_text()
        actor_log = (config.run_dir / "logs" / "actor-0.log").read_text(errors="replace")
        assert "weight versions are LoRA adapters" in actor_log
    records = [json.loads(line) for line in (config.run_dir / "learner" / "metrics.jsonl").read_text().splitlines()]
    assert len({r["step"] for r in records}) >= 6 and result["learner"].get("version", 0) >= 6
    if model == "tiny-moe":
        assert all(r["routing_recorded_share"] == 0.0 and r["expert_load_max"] >= 1.0 for r in records), records
    with PoolReader(config.run_dir / "pool") as pool:
        entries = pool.entries(start=0, limit=100_000)
        calls = [c for e in entries for s in e.members for c in pool.get_session(s).calls]
    assert calls and max(v for c in calls for v in c.weight_versions) >= 1, "no call used a learner version"
    services = json.loads((config.run_dir / "services.json").read_text())
    assert {s["kind"] for s in services} == {"learner", "actor", "gateway"}        # no L3 cache beside vLLM

