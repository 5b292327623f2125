"""The service registry and the command lines built from it: every service is declared once and the programs exist;
forge up's children get command lines that their real commands parse back into exactly the settings forge up
checked; forge deploy's commands name only options the services have; forge config show up lists the services'
settings with their sources."""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from forge.app.command_line import Shell, changed, option_words
from forge.app.config_show import show
from forge.app.registry import KEY_KINDS, SERVICES, STATS_SERVICES
from forge.app.up.config import UpConfig
from forge.app.up.keys import generate
from forge.app.up.plan import Plan
from forge.cli.options import SettingsCommand
from forge.settings import SettingsError, entries
from forge.weights.curve import create_keys


def test_every_service_is_declared_once_with_its_command_keys_and_stats():
    assert set(SERVICES) == {"learner", "actor", "gateway", "cache", "pool", "rollout", "tinker"}
    for kind, service in SERVICES.items():
        assert isinstance(service.command, SettingsCommand) and service.table == kind
        secrets = {e.name for e in entries(service.settings_class) if e.spec.secret and not e.key_file}
        assert set(service.keys) <= secrets, kind                   # every key goes to a secret option
        assert service.start_s > 0 and service.stop_s > 0
    assert set(KEY_KINDS) == {"gateway", "actor", "pool", "cache", "session"}
    assert set(STATS_SERVICES) == {"learner", "actor", "gateway", "cache", "pool", "router", "tinker"}


def parsed(command: click.Command, words: list[str]):
    """The settings ``command`` builds from ``words``, as the child process would (no environment of its own)."""
    context = command.make_context(command.name, list(words))
    return command.settings_from(dict(context.params))


@pytest.fixture
def keyed_plan(tmp_path: Path) -> Plan:
    config = UpConfig(run_dir=tmp_path / "run", prefill_actors=1, actors=2, seed=5, metrics=True,
                      settings=("learner.lr=3e-4", "actor.max_batch=12", "gateway.router=least-loaded"))
    config = config.with_services(learner={"loss": {"eps_high": 0.4}, "speed_domains": ["qa", "agent"]},
                                  cache={"capacity_mb": 64})
    names = [f"actor-{i}" for i in range(2)] + ["actor-prefill-0"]
    return Plan(config, generate(tmp_path / "keys"), create_keys(tmp_path / "keys" / "weights", names))


def test_forge_ups_command_lines_parse_back_into_the_settings_it_checked(keyed_plan):
    instances = keyed_plan.check()
    assert {i.service.kind for i in instances} == {"cache", "learner", "actor", "gateway"}
    for instance in instances:
        words = instance.arguments()
        assert not [w for w in words if any(k in w for k in keyed_plan.keys.keys.values())], "a key in the words"
        assert parsed(instance.service.command, words) == instance.settings, instance.name
    actor = next(i for i in instances if i.name == "actor-1")
    assert actor.settings.engine.max_num_seqs == 12 and actor.settings.engine.seed == 6      # --set; seed + index
    assert "--l3-api-key-file" in actor.arguments() and "--weights-key" in actor.arguments()


def test_secrets_given_without_key_files_go_to_the_childs_variables(tmp_path):
    config = UpConfig(run_dir=tmp_path / "run", keys=False).with_services(gateway={"pool_api_key": "s3cret"})
    gateway = next(i for i in Plan(config).check() if i.service.kind == "gateway")
    assert "s3cret" not in " ".join(gateway.arguments())
    assert gateway.environment()["FORGE_GATEWAY_POOL_API_KEY"] == "s3cret"
    assert "FORGE_GATEWAY_POOL_API_KEY" in gateway.withheld()      # forge up's own variables are not passed on


def test_the_builder_refuses_what_a_setting_refuses():
    actor = SERVICES["actor"]
    with pytest.raises(ValueError, match="has no option --nope"):
        option_words(actor, {"nope": 1})
    with pytest.raises(ValueError, match="--port: must be <= 65535"):
        option_words(actor, {"port": 70000})
    with pytest.raises(ValueError, match="a secret"):
        option_words(actor, {"api_key": ("k",)})
    assert option_words(actor, {"port": Shell("$port"), "speculative": False, "kv_cache_mb": 96 * 2**20}) == [
        "--port", "$port", "--no-speculative", "--kv-cache-mb", "96"]
    assert changed(parsed(actor.command, ["--max-batch", "3"])) == {"max_batch": 3}


def test_config_show_up_lists_every_services_settings_with_its_source(tmp_path, monkeypatch):
    run_file = tmp_path / "run.toml"
    run_file.write_text("[actor]\nmax_batch = 9\n")
    monkeypatch.setenv("FORGE_LEARNER_LR", "7e-4")
    result = CliRunner().invoke(show, ["up", "--config", str(run_file), "--json"])
    assert result.exit_code == 0, result.output
    services = json.loads(result.output)["services"]
    assert set(services) == {"cache", "learner", "actor", "gateway"}
    rows = {kind: {r["name"]: r for r in found} for kind, found in services.items()}
    assert rows["actor"]["max_batch"]["source"] == "file" and rows["actor"]["max_batch"]["value"] == 9
    assert rows["learner"]["lr"]["source"] == "environment" and rows["learner"]["lr"]["value"] == 7e-4
    assert rows["learner"]["warmup_steps"]["source"] == "forge up"          # the main job's tuning
    assert rows["actor"]["kv_cache_mb"]["value"] == 96 and rows["learner"]["pool"]["source"] == "wired"
    assert rows["gateway"]["actor"]["value"] == "(wired at start)"
    assert rows["learner"]["grad_clip"]["source"] == "default"


def test_several_runs_share_the_actors_each_with_its_learner_gateway_and_adapter(tmp_path):
    config = UpConfig(run_dir=tmp_path / "run", runs=("a", "b"), actors=2, seed=3).with_services(
        learner={"lora_rank": 4})
    instances = {i.name: i for i in Plan(config, generate(tmp_path / "keys")).check()}
    assert {"learner-a", "learner-b", "gateway-a", "gateway-b", "actor-0", "actor-1"} <= set(instances)
    assert "learner" not in instances and "gateway" not in instances
    for name, seed in (("a", 3), ("b", 4)):
        learner = instances[f"learner-{name}"].settings
        assert learner.lora.publish == "adapters" and learner.trainer.seed == seed
        pool = str(tmp_path / "run" / name / "pool")
        assert pool in instances[f"learner-{name}"].arguments() and pool in instances[f"gateway-{name}"].arguments()
        assert instances[f"gateway-{name}"].settings.adapter == name
    actor = instances["actor-1"].settings
    assert [link.name for link in actor.adapter_links] == ["a", "b"] and actor.weights_fetch is None
    for instance in instances.values():
        assert parsed(instance.service.command, instance.arguments()) == instance.settings, instance.name


def test_several_runs_stream_their_adapters_over_curve_each_from_its_learner(tmp_path):
    from forge.weights.curve import create_publisher_keys

    config = UpConfig(run_dir=tmp_path / "run", runs=("a", "b")).with_services(learner={"lora_rank": 4})
    curve = create_keys(tmp_path / "keys" / "weights", ["actor-0"])
    lanes = {name: create_publisher_keys(tmp_path / "keys" / "weights" / "runs" / name) for name in ("a", "b")}
    instances = {i.name: i for i in Plan(config, None, curve, lanes).check()}
    actor = instances["actor-0"].settings
    assert actor.weights_key == curve.client_secrets["actor-0"] and actor.weights_server_key is None
    assert {link.name: link.server_key for link in actor.adapter_links} == {n: lanes[n][1] for n in ("a", "b")}
    for name in ("a", "b"):
        learner = instances[f"learner-{name}"].settings
        assert learner.weights_key == lanes[name][0] and learner.weights_clients == curve.clients_dir


def test_several_runs_need_lora_adapters_on_actors_that_serve_them(tmp_path):
    runs = UpConfig(run_dir=tmp_path / "run", runs=("a", "b"))
    with pytest.raises(SettingsError, match="give \\[learner\\] lora_rank"):
        Plan(runs)
    with pytest.raises(SettingsError, match="lora_publish = \"merged\""):
        Plan(runs.with_services(learner={"lora_rank": 4, "lora_publish": "merged"}))
    with pytest.raises(SettingsError, match="serve named adapters"):
        Plan(runs.with_services(learner={"lora_rank": 4}, actor={"backend": "trtllm"}))
    with pytest.raises(SettingsError, match="above what the vLLM actors serve"):
        Plan(runs.with_services(learner={"lora_rank": 128}, actor={"backend": "vllm", "max_adapter_rank": 64}))
    with pytest.raises(SettingsError, match="given twice"):
        UpConfig(runs=("a", "a"))
    with pytest.raises(SettingsError, match="--prefill-actors"):
        UpConfig(runs=("a", "b"), prefill_actors=1)


def test_a_training_run_refuses_the_load_test_backend(tmp_path):
    """It samples no model: ``forge up`` refuses it before anything starts."""
    config = UpConfig(run_dir=tmp_path / "run").with_services(actor={"backend": "loadtest"})
    with pytest.raises(SettingsError, match="samples no model"):
        Plan(config)
