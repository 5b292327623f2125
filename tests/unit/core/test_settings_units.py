"""Settings declared once: every service's click options are its settings dataclasses' fields (same names,
defaults and help), values come from flags, FORGE_<COMMAND>_<OPTION> variables, the run file and the defaults in
that order, bad values are refused with the option's name from every source, and keys are read from key files.
(Through the programs, ``forge config show`` among them: integration/test_settings.py.)"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from forge.app.config_show import settings_commands
from forge.app.main import forge
from forge.app.up.cli import UpCommand, services_from
from forge.app.up.config import RENAMED, UpConfig
from forge.app.up.plan import Plan
from forge.cli.options import SettingsCommand, click_value, envvars_of, settings_command
from forge.learner.config import LearnerConfig
from forge.pool import WindowConfig
from forge.settings import Settings, SettingsError, build, entries, setting

COMMANDS = settings_commands()
NOT_SETTINGS = {"config", "help"}


@pytest.mark.parametrize("table", sorted(COMMANDS))
def test_options_and_settings_fields_are_the_same(table):
    command = COMMANDS[table]
    options = {p.name: p for p in command.params if isinstance(p, click.Option) and p.name not in NOT_SETTINGS
               and not p.hidden}
    fields = {e.name: e for e in entries(command.settings_class) if not e.spec.argument}
    assert set(options) == set(fields), (f"only options: {sorted(set(options) - set(fields))}; "
                                         f"only fields: {sorted(set(fields) - set(options))}")
    for name, entry in fields.items():
        option = options[name]
        default = option.default if not option.multiple else tuple(option.default or ())
        assert default == click_value(entry, entry.default), name
        assert option.help.startswith(entry.spec.help), name
        assert option.envvar[0] == f"FORGE_{table.upper()}_{name.upper()}", name
    assert any(p.name == "config" for p in command.params)


def test_forge_ups_renamed_options_still_work_with_a_warning(tmp_path):
    """forge up's own copies of the services' settings became --set SERVICE.OPTION: the old options, variables and
    [up] keys still work (hidden from --help), with a warning naming the setting."""
    hidden = {p.name for p in COMMANDS["up"].params if isinstance(p, click.Option) and p.hidden}
    assert hidden == set(RENAMED)
    run_file = tmp_path / "run.toml"
    run_file.write_text("[up]\nwarmup_steps = 7\nspeed_domains = [\"qa\", \"agent\"]\n")
    seen = {}

    def capture(config):
        seen["config"] = config

    command = UpCommand()
    command._run = capture
    result = CliRunner().invoke(command, ["--config", str(run_file), "--lr", "1e-3", "--run-dir", str(tmp_path)],
                                env={"FORGE_UP_BACKEND": "torch"})
    assert result.exit_code == 0, result.output
    assert "--lr (or [up] lr) is deprecated: give --set learner.lr=VALUE" in result.output
    config = seen["config"]
    learner = config.overrides("learner")
    assert learner.values["lr"] == 1e-3 and learner.values["warmup_steps"] == 7
    assert learner.values["speed_domains"] == ("qa", "agent") and config.overrides("actor").values["backend"] == "torch"
    assert "--lr" not in CliRunner().invoke(command, ["--help"]).output


def commands_of(group: click.Group, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], click.Command]]:
    found = []
    for name, command in group.commands.items():
        found.append(((*path, name), command))
        if isinstance(command, click.Group):
            found += commands_of(command, (*path, name))
    return found


def test_every_command_derives_its_options_from_settings():
    """No hand-written option: every command of forge (and the engine core's and the helper scripts') is a
    SettingsCommand, whose options, variables and run-file keys come from its settings' fields."""
    from forge.actors.engine.core import main as engine_core
    from forge.app.pretrain import main as pretrain
    from forge.app.random_checkpoint import main as random_checkpoint

    leaves = [(" ".join(path), command) for path, command in commands_of(forge) if not isinstance(command, click.Group)]
    leaves += [("engine core", engine_core), ("pretrain", pretrain), ("random checkpoint", random_checkpoint)]
    assert [name for name, command in leaves if not isinstance(command, SettingsCommand)] == []


def test_every_command_takes_a_run_file():
    missing = [" ".join(path) for path, command in commands_of(forge)
               if not isinstance(command, click.Group) and not any(p.name == "config" for p in command.params)
               and path[0] != "config"]
    assert missing == []


def test_every_settings_field_has_help():
    for command in COMMANDS.values():
        for entry in entries(command.settings_class):
            assert entry.spec.help.strip().endswith((".", ")", "]")), f"{command.name} {entry.flag}: {entry.spec.help!r}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Inner(Settings):
    rate: float = setting(0.5, min=0, max=1, help="A fraction.")
    names: tuple[str, ...] = setting(("a",), separator=",", choices=("a", "b", "c"), help="Some names.")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Probe(Settings):
    port: int = setting(1, min=0, max=65535, help="A port.")
    size_bytes: int = setting(4 * 2**20, flag="size-mb", scale=2**20, min=2**20, help="A size.")
    keys: tuple[str, ...] = setting((), flag="key", secret=True, help="Keys (repeatable).")
    verbose: bool = setting(False, help="Say more.")
    inner: Inner = dataclasses.field(default_factory=Inner)

    def check(self) -> None:
        if self.verbose and self.port == 0:
            raise SettingsError("--verbose needs a fixed --port")


@settings_command("probe", Probe)
def probe(config: Probe) -> None:
    """Print the built settings."""
    click.echo(json.dumps(dataclasses.asdict(config), default=str))


def run_probe(*args: str, env: dict[str, str] | None = None):
    result = CliRunner().invoke(probe, list(args), env=env)
    return result.exit_code, (json.loads(result.output) if result.exit_code == 0 else result.output)


def test_precedence_flag_over_environment_over_file_over_default(tmp_path):
    run_file = tmp_path / "run.toml"
    run_file.write_text('[probe]\nport = 3\nsize-mb = 8\n\n[probe.inner]\nrate = 0.25\nnames = ["b", "c"]\n')
    assert run_probe()[1]["port"] == 1
    code, built = run_probe("--config", str(run_file))
    assert code == 0 and built["port"] == 3 and built["size_bytes"] == 8 * 2**20
    assert built["inner"] == {"rate": 0.25, "names": ["b", "c"]}
    assert run_probe("--config", str(run_file), env={"FORGE_PROBE_PORT": "4"})[1]["port"] == 4
    assert run_probe("--config", str(run_file), "--port", "5", env={"FORGE_PROBE_PORT": "4"})[1]["port"] == 5
    assert run_probe("--key", "k1", "--key", "k2")[1]["keys"] == ["k1", "k2"]


@pytest.mark.parametrize(("args", "file", "message"), [
    (["--port", "70000"], "", "70000 is not in the range"),
    (["--size-mb", "0"], "", "--size-mb"),
    ([], "[probe]\nrate = 2.0\n", "--rate"),
    ([], "[probe]\nnames = ['a', 'z']\n", "Invalid value for '--names': must be one of a, b, c, got 'z'"),
    ([], "[probe]\nprot = 3\n", "unknown setting prot"),
    ([], "[probe\n", "cannot read"),
    (["--key", " "], "", "Invalid value for '--key': an empty value is not allowed"),
    (["--verbose", "--port", "0"], "", "--verbose needs a fixed --port"),
])
def test_bad_values_are_refused_naming_the_option(tmp_path, args, file, message):
    run_file = tmp_path / "run.toml"
    run_file.write_text(file)
    code, output = run_probe(*args, *(["--config", str(run_file)] if file else []))
    assert code == 2 and message in output, output


def test_settings_built_in_code_are_validated_too():
    with pytest.raises(SettingsError, match="--min-groups"):
        WindowConfig(batch_groups=2, min_groups=3)
    with pytest.raises(SettingsError, match="--lr: must be > 0"):
        build(LearnerConfig, {"pool": Path("p"), "lr": 0.0})
    with pytest.raises(SettingsError, match="exactly one of --pool and --pool-address"):
        LearnerConfig()
    with pytest.raises(SettingsError, match="--context-parallel 2 must divide the job's 3 processes"):
        build(LearnerConfig, {"pool": Path("p"), "nproc": 3, "context_parallel": 2})
    with pytest.raises(SettingsError, match="--context-parallel splits packed trees: it needs --tree"):
        build(LearnerConfig, {"pool": Path("p"), "nproc": 2, "context_parallel": 2, "tree": False})
    assert build(LearnerConfig, {"pool": Path("p"), "nproc": 2, "nnodes": 2, "rdzv_endpoint": "h:1",
                                 "context_parallel": 4}).trainer.context_parallel == 4
    built = build(LearnerConfig, {"pool": Path("p"), "eps_high": 0.3, "weight_decay": 0.1, "grad_clip": 0.5})
    assert (built.loss.eps_high, built.trainer.weight_decay, built.trainer.grad_clip) == (0.3, 0.1, 0.5)


def test_forge_up_tunes_the_services_through_their_own_settings_and_yields_to_the_run(tmp_path):
    run_file = tmp_path / "run.toml"
    run_file.write_text('[learner]\nlr = 1e-3\n\n[learner.loss]\ntoken_norm = "token"\n\n[actor]\nkv_cache_mb = 64\n')
    config = UpConfig(run_dir=tmp_path / "run", seed=3, settings=("learner.warmup_steps=5",),
                      services=services_from(str(run_file), {"FORGE_ACTOR_THREADS": "2"}))
    by_name = {i.name: i for i in Plan(config).check()}
    learner, actor = by_name["learner"], by_name["actor-0"]
    trainer = learner.settings.trainer
    assert (trainer.lr, trainer.warmup_steps, trainer.seed) == (1e-3, 5, 3)      # file, --set, forge up's seed
    assert learner.settings.loss.token_norm == "token" and learner.settings.reward.beta == 0.2   # file; main job
    assert learner.sources["lr"] == "file" and learner.sources["warmup_steps"] == "--set"
    assert learner.sources["beta"] == "forge up" and learner.sources["pool"] == "wired"
    assert actor.settings.engine.kv_cache_bytes == 64 * 2**20 and actor.settings.engine.threads == 2
    assert actor.sources["threads"] == "environment"
    words = learner.arguments()
    assert words[words.index("--lr") + 1] == "0.001" and "--config" not in words
    assert "--token-norm" not in words           # the file gives the learner's own default back
    assert "FORGE_LEARNER_LR" in learner.withheld()
    with pytest.raises(SettingsError, match="--prefill-min-tokens: 0 is not in the range"):
        config.with_services(gateway={"prefill_min_tokens": 0})
    with pytest.raises(SettingsError, match="learner: --nnodes > 1 needs --rdzv-endpoint"):      # before any start
        Plan(config.with_services(learner={"nnodes": 2})).check()


def test_derived_environment_names_follow_the_table():
    entry = next(e for e in entries(COMMANDS["actor"].settings_class) if e.name == "api_key")
    assert envvars_of(entry, "actor") == ["FORGE_ACTOR_API_KEY", "FORGE_ACTOR_API_KEYS"]


def test_a_command_line_setting_is_split_as_a_shell_would():
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Program(Settings):
        command: tuple[str, ...] = setting((), separator="shell", help="A command line.")

    @settings_command("program", Program)
    def program(config: Program) -> None:
        """Print the argv."""
        click.echo(json.dumps(config.command))

    result = CliRunner().invoke(program, ["--command", "python 'my agent.py' --fast"])
    assert json.loads(result.output) == ["python", "my agent.py", "--fast"]
    result = CliRunner().invoke(program, ["--command", "python 'unclosed"])
    assert result.exit_code == 2 and "cannot split" in result.output


def test_a_table_setting_takes_a_run_files_table_a_json_object_or_a_variable(tmp_path):
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Loader(Settings):
        args: dict = setting(factory=dict, help="Keyword arguments.")

    @settings_command("loader", Loader)
    def loader(config: Loader) -> None:
        """Print the arguments."""
        click.echo(json.dumps(config.args))

    assert json.loads(CliRunner().invoke(loader, []).output) == {}
    given = CliRunner().invoke(loader, ["--args", '{"num_train": 64, "name": "x"}'])
    assert json.loads(given.output) == {"num_train": 64, "name": "x"}
    run_file = tmp_path / "run.toml"
    run_file.write_text('[loader]\nargs = { num_train = 8, split = { eval = 0.1 } }\n')
    from_file = CliRunner().invoke(loader, ["--config", str(run_file)])
    assert json.loads(from_file.output) == {"num_train": 8, "split": {"eval": 0.1}}, from_file.output
    from_variable = CliRunner().invoke(loader, [], env={"FORGE_LOADER_ARGS": '{"seed": 3}'})
    assert json.loads(from_variable.output) == {"seed": 3}
    for bad in ("[1, 2]", "{not json"):
        refused = CliRunner().invoke(loader, ["--args", bad])
        assert refused.exit_code == 2 and "is not a JSON object" in refused.output, refused.output
    with pytest.raises(SettingsError, match="must be dict"):
        Loader(args=[1])


def test_addresses_of_every_form_a_deployment_uses_are_accepted():
    from forge.rpc.client import check_address

    for address in ("127.0.0.1:50051", "localhost:1", "actor-3.forge.svc:50051", "[::1]:5000"):
        assert check_address(address) == address


# ------------------------------------------------------------------------------------------------ key files

SECRETS = [(table, entry) for table, command in sorted(COMMANDS.items()) for entry in entries(command.settings_class)
           if entry.spec.secret]


def test_every_secret_has_a_key_file_option_and_its_help_says_why():
    assert {table for table, _ in SECRETS} >= {"actor", "cache", "gateway", "learner", "pool", "rollout"}
    for table, entry in SECRETS:
        options = {p.name: p for p in COMMANDS[table].params if isinstance(p, click.Option)}
        key_file = options[f"{entry.name}_file"]
        assert key_file.envvar[0] == f"FORGE_{table.upper()}_{entry.name.upper()}_FILE", (table, entry.name)
        assert "visible to every local user in the process list" in options[entry.name].help, (table, entry.name)
        assert f"{entry.flag}-file PATH" in options[entry.name].help, (table, entry.name)


def test_keys_are_read_from_the_file_one_a_line_without_comments_or_blanks(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("# the run's keys\n\n  k1  \nk2\t\n   \n#k3\n")
    assert run_probe("--key-file", str(keys))[1]["keys"] == ["k1", "k2"]
    assert run_probe(env={"FORGE_PROBE_KEY_FILE": str(keys)})[1]["keys"] == ["k1", "k2"]
    run_file = tmp_path / "run.toml"
    run_file.write_text(f'[probe]\nkey_file = "{keys}"\n')
    assert run_probe("--config", str(run_file))[1]["keys"] == ["k1", "k2"]
    assert build(Probe, {"key_file": keys}).keys == ("k1", "k2")


@pytest.mark.parametrize(("content", "args", "message"), [
    (None, [], "Invalid value for '--key-file': cannot read"),
    ("# none here\n\n", [], "Invalid value for '--key-file': "),
    ("k1\n", ["--key", "k0"], "give --key or --key-file, not both"),
])
def test_a_key_file_that_gives_no_key_or_comes_with_a_key_is_refused(tmp_path, content, args, message):
    keys = tmp_path / "keys"
    if content is not None:
        keys.write_text(content)
    code, output = run_probe("--key-file", str(keys), *args)
    assert code == 2 and message in output, output
    code, output = run_probe(env={"FORGE_PROBE_KEY_FILE": ""})
    assert code == 2 and "FORGE_PROBE_KEY_FILE is set but empty" in output, output


def test_a_single_key_setting_takes_a_file_of_one_key(tmp_path):
    from forge.gateway.config import GatewayConfig

    keys = tmp_path / "keys"
    keys.write_text("only\n")
    built = build(GatewayConfig, {"actor": ("127.0.0.1:1",), "pool": "p", "actor_api_key_file": keys})
    assert built.actor_api_key == "only"
    keys.write_text("one\ntwo\n")
    with pytest.raises(SettingsError, match=r"--actor-api-key-file: .* holds 2 keys; this option takes one"):
        build(GatewayConfig, {"actor": ("127.0.0.1:1",), "pool": "p", "actor_api_key_file": keys})
