"""The wire contracts: checked-in stubs are what the pinned protoc generates, and every service answers Stats."""

from __future__ import annotations

import importlib
import importlib.util
import sys

import pytest

from conftest import REPO

SERVICES = {"actor": "Actor", "gateway": "Gateway", "pool": "Pool", "cache": "Cache", "router": "Router",
            "learner": "Learner", "tinker": "Tinker"}


def load_generator():
    spec = importlib.util.spec_from_file_location("gen_protos", REPO / "tools" / "gen_protos.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gen_protos"] = module
    spec.loader.exec_module(module)
    return module


def test_checked_in_stubs_are_not_stale(tmp_path):
    pytest.importorskip("grpc_tools")
    generated = load_generator().generate(tmp_path)
    assert generated, "protoc generated nothing"
    checked_in = REPO / "protos" / "forge" / "v1"
    expected_names = sorted(p.name for p in generated)
    actual_names = sorted(p.name for p in checked_in.iterdir() if p.name.endswith(("_pb2.py", "_pb2.pyi",
                                                                                      "_pb2_grpc.py")))
    assert actual_names == expected_names, "stubs missing or left over: run `make protos`"
    for path in generated:
        assert (checked_in / path.name).read_bytes() == path.read_bytes(), f"{path.name} is stale: run `make protos`"


@pytest.mark.parametrize("module, service", sorted(SERVICES.items()))
def test_every_service_is_in_package_forge_v1_and_answers_stats(module, service):
    pb2 = importlib.import_module(f"forge.v1.{module}_pb2")
    grpc_module = importlib.import_module(f"forge.v1.{module}_pb2_grpc")
    descriptor = pb2.DESCRIPTOR.services_by_name[service]
    assert descriptor.full_name == f"forge.v1.{service}"
    stats = descriptor.methods_by_name["Stats"]
    assert stats.output_type.full_name == "forge.v1.StatsReport"
    assert hasattr(grpc_module, f"{service}Stub")


def test_streaming_shapes():
    from forge.v1 import actor_pb2, cache_pb2, gateway_pb2

    generate = actor_pb2.DESCRIPTOR.services_by_name["Actor"].methods_by_name["Generate"]
    assert generate.server_streaming and not generate.client_streaming
    chat = gateway_pb2.DESCRIPTOR.services_by_name["Gateway"].methods_by_name["Chat"]
    assert chat.server_streaming
    put = cache_pb2.DESCRIPTOR.services_by_name["Cache"].methods_by_name["Put"]
    assert put.client_streaming
