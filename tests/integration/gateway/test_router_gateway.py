"""The cost-aware router inside a real gateway with two real actors: it polls the actors' KV events, keeps a
session's turns and a shared prompt prefix on the actor that holds them, and reports its figures in Stats. (Its
back-off from a server without KV events: unit/test_router_gateway.py.)"""

from __future__ import annotations

from forge.rpc import connect
from forge.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc

from helpers.gateway_procs import start_actor, start_gateway
from helpers.waiting import wait_for


def test_the_gateway_routes_by_cached_prefix_and_reports_router_figures(tmp_path):
    actors = [start_actor(tmp_path, f"actor{i}") for i in range(2)]
    gateway = start_gateway(tmp_path, [a.address for a in actors], tmp_path / "pool", name="gateway")
    try:
        stub = gateway_pb2_grpc.GatewayStub(connect(gateway.grpc_address))
        sampling = common_pb2.SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
        system = [(i * 37) % 1000 for i in range(320)]                  # a long shared system prompt

        def call(session: str, prompt: list[int]) -> tuple[str, list[int]]:
            chunks = list(stub.Generate(gateway_pb2.SessionGenerateRequest(session_id=session, prompt_ids=prompt,
                                                                            sampling=sampling), timeout=60))
            return chunks[0].actor, [t for c in chunks for t in c.token_ids]

        def gauges() -> dict[str, float]:
            return dict(stub.Stats(common_pb2.StatsRequest(), timeout=10).gauges)

        first = stub.StartSession(gateway_pb2.StartSessionRequest(task_id="t"), timeout=10).session.session_id
        home, completion = call(first, [*system, 7, 8, 9])
        address = next(a.address for a in actors if a.address.endswith(home.removeprefix("actor-")))
        wait_for(lambda: gauges().get(f"router_cached_blocks/{address}", 0) >= len(system) // 16,
                 "the router to learn the prompt's blocks from the actor's KV events")
        assert call(first, [*system, 7, 8, 9, *completion, 10, 11])[0] == home       # the session's next turn
        for i in range(3):                                                              # other sessions, same prefix
            other = stub.StartSession(gateway_pb2.StartSessionRequest(task_id=f"o{i}"), timeout=10).session
            assert call(other.session_id, [*system, 20 + i])[0] == home
        figures = gauges()
        assert figures["router_decisions"] == 5 and figures["router_ttft_observed"] == 5
        assert figures[f"router_prefill_tps/{address}"] > 0 and "router_ttft_abs_error_ms" in figures
        report = stub.Stats(common_pb2.StatsRequest(), timeout=10)
        assert report.labels["router"] == "cost-aware+affinity"
    finally:
        gateway.stop()
        for actor in actors:
            actor.stop()
