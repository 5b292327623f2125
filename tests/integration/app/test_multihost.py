"""A two-host deployment on one machine, each "host" on its own loopback address: host A (127.0.0.2) runs the pool
service, the L3 cache, learner node 0, an actor that relays the weights and the gateway; host B (127.0.0.3) runs
learner node 1 and an actor fed by A's relay. The actors announce themselves in a ready-file directory the gateway
watches. The team's white-box agent plays its tasks through the gateway while the two-node learner trains; every
version the learner publishes reaches both actors; a killed actor is dropped and, restarted, added again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from forge.app.registry import stats_method
from forge.checkpoints import TINY_DIR
from forge.launch import ServiceProcess
from forge.v1 import common_pb2

from conftest import REPO, free_port, script
from helpers.waiting import wait_for

A, B = "127.0.0.2", "127.0.0.3"
EXAMPLES = REPO / "examples"
pytestmark = pytest.mark.xdist_group("serial")  # a whole system on two hosts: one at a time (conftest.SERIAL)


def gauges(address: str, kind: str) -> dict[str, float]:
    """A service's Stats gauges (``kind``: actor, gateway or learner)."""
    with grpc.insecure_channel(address) as channel:
        stats = channel.unary_unary(stats_method(kind), request_serializer=common_pb2.StatsRequest.SerializeToString,
                                    response_deserializer=common_pb2.StatsReport.FromString)
        return dict(stats(common_pb2.StatsRequest(), timeout=10).gauges)


def run_file(directory: Path) -> Path:
    path = directory / "run.toml"
    path.write_text(f'''
[tasks]
train = "{EXAMPLES / 'blackbox' / 'tasks' / 'train.jsonl'}"
verifier = "{EXAMPLES / 'blackbox' / 'verify.py'}:score"
group_size = 2

[agent]
python = "{EXAMPLES / 'whitebox' / 'agent.py'}:ColorAgent"
''')
    return path


def actor(directory: Path, name: str, host: str, fetch: str, announce: str, cache: str, *extra: str
          ) -> ServiceProcess:
    """An actor whose ready file lands in ``directory`` (the gateway's --actors-dir) as NAME.json."""
    return ServiceProcess(name, "forge-actor", ["--host", host, "--port", "0", "--name", name, "--kv-cache-mb", "32",
                                                "--threads", "1", "--weights-fetch", fetch, "--weights-announce",
                                                announce, "--l3-cache", cache, *extra], directory, timeout_s=180)


@pytest.mark.slow
@pytest.mark.timeout(1500)
@pytest.mark.skipif(not any(TINY_DIR.glob("*.safetensors")), reason="the pre-trained tiny checkpoint is not shipped")
def test_two_hosts_train_publish_to_every_actor_and_replace_a_killed_one(tmp_path):
    actors_dir = tmp_path / "actors"
    services: list[ServiceProcess] = []
    rollout = learner_b = None
    try:
        pool = ServiceProcess("pool", "forge", ["pool", "serve", "--path", str(tmp_path / "pool"), "--host", A,
                                                "--port", "0"], tmp_path, timeout_s=60)
        services.append(pool)
        cache = ServiceProcess("cache", "forge-cache", ["--dir", str(tmp_path / "cache"), "--host", A, "--port", "0"],
                               tmp_path, timeout_s=60)
        services.append(cache)

        rendezvous = f"{A}:{free_port(A)}"
        learner_args = ["--pool-address", pool.info["address"], "--run-dir", str(tmp_path / "learner"),
                        "--nnodes", "2", "--rdzv-endpoint", rendezvous, "--device", "cpu", "--batch-groups", "2",
                        "--lr", "1e-3", "--max-wait", "1", "--checkpoint-every", "2"]
        learner_b = subprocess.Popen([script("forge-learner"), *learner_args, "--node-rank", "1", "--host", B,
                                      "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        learner = ServiceProcess("learner", "forge-learner", [*learner_args, "--node-rank", "0", "--host", A,
                                                              "--weights-fetch", f"tcp://{A}:*",
                                                              "--weights-announce", f"tcp://{A}:*"],
                                 tmp_path, timeout_s=300)
        services.append(learner)

        weights = (learner.info["weights_fetch"], learner.info["weights_announce"])
        relay = actor(actors_dir, "actor-a", A, *weights, cache.info["address"], "--relay-fetch", f"tcp://{A}:*",
                      "--relay-announce", f"tcp://{A}:*")
        services.append(relay)
        fed = (relay.info["relay_fetch"], relay.info["relay_announce"])
        second = actor(actors_dir, "actor-b", B, *fed, cache.info["address"])
        services.append(second)
        assert relay.info["address"].startswith(f"{A}:") and second.info["address"].startswith(f"{B}:")

        # Round robin: every new session reaches a re-added actor. The default (cost-aware) router rightly keeps
        # sending them to the actor whose cache holds the agent's prompts, so whether the restarted one gets a call
        # would depend on how loaded the machine is; every router's handling of actors that come and go is tested
        # in tests/unit/gateway/test_gateway_discovery_units.py.
        gateway = ServiceProcess("gateway", "forge-gateway", [
            "--actors-dir", str(actors_dir), "--discovery-interval", "0.2", "--drop-after", "1",
            "--health-interval", "0.2", "--pool-address", pool.info["address"], "--host", A, "--grpc-port", "0",
            "--http-port", "0", "--router", "round-robin"], tmp_path, timeout_s=120)
        services.append(gateway)
        at = gateway.info["grpc_address"]
        wait_for(lambda: gauges(at, "gateway").get("actors") == 2, "both actors to join the gateway", 120, watched=[gateway])

        rollout = subprocess.Popen([script("forge"), "rollout", "--config", str(run_file(tmp_path)), "--gateway", at,
                                    "--http", gateway.info["http_address"], "--max-tokens", "24",
                                    "--groups-in-flight", "4"],
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path)

        def learner_at(step: int) -> bool:
            return gauges(learner.info["address"], "learner").get("step", 0) >= step

        wait_for(lambda: learner_at(3), "the two-node learner's third step", 900,
                 watched=[learner, gateway, relay, second])
        version = int(gauges(learner.info["address"], "learner")["version"])
        assert version >= 3
        for service in (relay, second):           # the relay's child gets every version through it
            wait_for(lambda s=service: gauges(s.info["address"], "actor").get("weight_version", -1) >= version,
                     f"{service.name} to apply version {version}", 300, watched=[service])
        calls = gauges(at, "gateway")
        assert calls.get(f"actor_calls/{relay.info['address']}", 0) > 0
        assert calls.get(f"actor_calls/{second.info['address']}", 0) > 0

        killed = second.info["address"]
        second.kill()
        wait_for(lambda: f"actor_calls/{killed}" not in gauges(at, "gateway"), "the gateway to drop the killed actor", 120,
                 watched=[gateway])
        assert gauges(at, "gateway")["actors"] == 1
        services.remove(second)
        second = actor(actors_dir, "actor-b", B, *fed, cache.info["address"])      # same ready file, new port
        services.append(second)
        back = second.info["address"]
        assert back != killed
        wait_for(lambda: gauges(at, "gateway").get("actors") == 2, "the restarted actor to be added again", 120,
                 watched=[gateway])
        latest = int(gauges(learner.info["address"], "learner")["version"])
        wait_for(lambda: gauges(back, "actor").get("weight_version", -1) >= latest,
                 "the restarted actor to catch up through the relay", 300, watched=[second])
        served = gauges(at, "gateway").get(f"actor_calls/{back}", 0)
        wait_for(lambda: gauges(at, "gateway").get(f"actor_calls/{back}", 0) > served,
                 "the restarted actor to serve calls again", 300, watched=[gateway, second])
    finally:
        if rollout is not None:
            rollout.send_signal(signal.SIGINT)
            try:
                rollout.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                rollout.kill()
        for service in reversed(services):
            service.stop(grace_s=60)
        if learner_b is not None:
            try:
                output, _ = learner_b.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                learner_b.kill()
                output, _ = learner_b.communicate()
            sys.stdout.write(output[-2000:])
    assert learner_b.returncode == 0, output[-3000:]
    assert os.path.isdir(tmp_path / "learner" / "checkpoints")
