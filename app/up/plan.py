"""What ``forge up`` runs, as typed settings: every service instance's settings are its service's defaults, the
main job's tuning (``MAIN_JOB``), what forge up derives from its own settings (the model, the seeds), the run's
overrides (run file, environment, ``--set``), and last the wiring forge up decides (addresses, ports, directories,
keys). Each instance's settings object is built, and so checked, before anything starts; its command line is made
from it (``forge.app.command_line``), with secrets in key files or the child's environment, never in the command.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forge.actors.config import AdapterLink, EngineConfig
from forge.actors.factory import factory_for
from forge.actors.kinds import backends_that, kind_of, pick_backend
from forge.app.api_keys import KeyFiles
from forge.app.command_line import changed, key_file_words, key_variables, option_words, secrets_of
from forge.app.registry import SERVICES, Service
from forge.app.up.config import UpConfig, main_job
from forge.app.up.keys import WIRED
from forge.cli.options import envvars_of
from forge.cli.overrides import Overrides
from forge.settings import SettingsError, entries
from forge.weights.curve import KeySet

LOOPBACK_ANY = "tcp://127.0.0.1:*"          # a ZeroMQ endpoint on a free loopback port
# Addresses known once their services serve (forge-cache's, the actors'): settings are checked before that with
# loopback ones of the same form in their place, one port per service.
def stand_in(index: int) -> str:
    return f"127.0.0.1:{index + 1}"


@dataclass(frozen=True)
class Instance:
    """One process forge up starts: its name (``actor-0``), its service, its checked settings, the key files and
    environment it is given, and where each setting came from."""

    name: str
    service: Service
    settings: Any
    key_files: Mapping[str, Path] = field(default_factory=dict)        # secret option → key file
    env: Mapping[str, str] = field(default_factory=dict)
    sources: Mapping[str, str] = field(default_factory=dict)           # option → source
    pending: frozenset[str] = frozenset()       # wired options whose values stand in for addresses known at start

    def arguments(self) -> list[str]:
        """Its options: every setting that differs from its default, then the key files."""
        return [*option_words(self.service, changed(self.settings)), *key_file_words(self.service, self.key_files)]

    def environment(self) -> dict[str, str]:
        """Its environment on top of forge up's: ``env``, the secrets not given as key files (in their variables,
        never on the command line), and none of the service's own FORGE_<SERVICE>_* variables, which forge up read
        already (the settings say what they said)."""
        given = {name: value for name, value in secrets_of(self.settings).items() if name not in self.key_files}
        variables = key_variables(self.service, given)
        secret = {variables[name]: " ".join(value) if isinstance(value, tuple) else value
                  for name, value in given.items()}
        return {**self.env, **secret}

    def withheld(self) -> tuple[str, ...]:
        """The variables of forge up's environment it is not given: its service's own."""
        return tuple(name for entry in entries(self.service.settings_class)
                     for name in envvars_of(entry, self.service.table))


def actor_roles(config: UpConfig) -> list[tuple[str, str]]:
    """(name, role) of every actor of a run: decode actors first, then prefill ones."""
    decoding = (config.decode_actors or config.actors) if config.prefill_actors else config.actors
    roles = [(f"actor-{i}", "decode" if config.prefill_actors else "both") for i in range(decoding)]
    return roles + [(f"actor-prefill-{i}", "prefill") for i in range(config.prefill_actors)]


ADAPTER_BACKENDS = backends_that("serves_adapters")     # take LoRA adapter versions (merged, or named)


@dataclass(frozen=True)
class Lane:
    """One run of a ``forge up``: its learner, gateways, pools and rollouts. A plain forge up has one, unnamed, in
    the run directory itself; with ``--run NAME``, one per name in RUN_DIR/NAME, whose learner trains the LoRA
    adapter NAME that the shared actors serve."""

    name: str
    directory: Path
    index: int = 0

    def instance(self, service: str) -> str:
        """The name of this lane's instance of ``service`` (``learner``, ``gateway``, ``gateway-eval``)."""
        return f"{service}-{self.name}" if self.name else service

    @property
    def title(self) -> str:
        return f"run {self.name}" if self.name else "run"


def lanes_of(config: UpConfig) -> list[Lane]:
    if not config.runs:
        return [Lane("", config.run_dir)]
    return [Lane(name, config.run_dir / name, index) for index, name in enumerate(config.runs)]


class Plan:
    """The settings of every instance of one run. ``keys`` (the run's API key files) and ``curve`` (its weight
    channel's CURVE key files) are None where the run goes without them, or to show the settings without a run."""

    def __init__(self, config: UpConfig, keys: KeyFiles | None = None, curve: KeySet | None = None,
                 lane_curves: Mapping[str, tuple[Path, Path]] | None = None) -> None:
        """``lane_curves``: with several runs, each run's learner key pair (secret, public) by run name, serving
        the actors of ``curve``."""
        self.config = config
        self.keys = keys
        self.curve = curve
        self.lane_curves = dict(lane_curves or {})
        self.overrides = {kind: main_job(kind) | self._derived(kind) | config.overrides(kind) for kind in WIRED}
        # A Hugging Face model is fetched before the services start: they read it from the cache, and nothing inside
        # them (transformers, vLLM) asks the Hub (forge.checkpoints.hub).
        self.hub_env = {"HF_HUB_OFFLINE": "1"} if config.hub_models() else {}
        actor = self.overrides["actor"].values
        # The actors' backend, ``auto`` settled for the run's model, and why (read once: it opens config.json).
        try:
            self.backend_and_why = pick_backend(actor.get("backend", "auto"), actor.get("model", "tiny"))
        except ValueError as exc:       # ModelNotFound: a Hugging Face model not fetched into the cache yet
            raise SettingsError(str(exc)) from None
        self._check_combination()

    def _derived(self, kind: str) -> Overrides:
        """What forge up's own settings say of a service's: the run's model and seed."""
        settings_class = SERVICES[kind].settings_class
        table: dict[str, Any] = {}
        names = {e.name for e in entries(settings_class)}
        if "model" in names:
            table["model"] = self.config.model.path
        if "model_impl" in names:
            table["model_impl"] = self.config.model.impl
        if "seed" in names:
            table["seed"] = self.config.seed
        return Overrides.of(settings_class, table, "forge up")

    @property
    def backend(self) -> str:
        return self.backend_and_why[0]

    @property
    def cache_on(self) -> bool:
        """forge-cache runs beside the torch engine only (the L3 cache is its)."""
        return self.config.cache and kind_of(self.backend).uses_l3_cache

    def roles(self) -> list[tuple[str, str]]:
        return actor_roles(self.config)

    def _check_combination(self) -> None:
        if not kind_of(self.backend).samples_model:
            raise SettingsError(f"[actor] backend = \"{self.backend}\" samples no model (it measures the middleware "
                                "alone): a training run needs torch, vllm, trtllm or auto")
        self._check_runs()
        self._check_teacher()
        if self.config.prefill_actors and not self.cache_on:
            raise SettingsError("--prefill-actors needs the torch backend and forge-cache (--cache): the prompt's KV "
                                f"is handed over through it (the actors' backend is {self.backend})")
        learner = self.overrides["learner"].values
        if (learner.get("lora_rank", 0) and learner.get("lora_publish") == "adapters"
                and not kind_of(self.backend).serves_adapters):
            raise SettingsError(f"[learner] lora_publish = \"adapters\" needs actors that merge adapter versions "
                                f"({' or '.join(ADAPTER_BACKENDS)}); the actors' backend is {self.backend}: publish "
                                f"merged weights")

    def _check_teacher(self) -> None:
        """A teacher whose tokenizer is not the student's is refused before anything starts."""
        if self.teacher is None:
            return
        from forge.learner.distill import check_same_tokenizer

        try:
            check_same_tokenizer(self.config.model.path, self.teacher)
        except ValueError as exc:               # ModelNotFound too
            raise SettingsError(f"[learner] teacher: {exc}") from None

    @property
    def shared(self) -> bool:
        """Several runs share the actors, each with its adapter (``--run``)."""
        return bool(self.config.runs)

    def lanes(self) -> list[Lane]:
        return lanes_of(self.config)

    def _check_runs(self) -> None:
        if not self.shared:
            return
        learner = self.overrides["learner"]
        if not learner.values.get("lora_rank", 0):
            raise SettingsError("--run trains LoRA adapters on shared actors: give [learner] lora_rank (e.g. --set "
                                "learner.lora_rank=8)")
        if learner.values.get("lora_publish", "adapters") != "adapters":
            raise SettingsError(f"--run: the runs publish their adapters to the shared actors; "
                                f"[learner] lora_publish = \"{learner.values['lora_publish']}\" "
                                f"({learner.sources.get('lora_publish')}) does not")
        if not kind_of(self.backend).serves_adapters:
            raise SettingsError(f"--run needs actors that serve named adapters ({' or '.join(ADAPTER_BACKENDS)}); "
                                f"the actors' backend is {self.backend}")
        rank = learner.values["lora_rank"]
        most = self.overrides["actor"].values.get("max_adapter_rank", EngineConfig().max_adapter_rank)
        if kind_of(self.backend).caps_adapter_rank and rank > most:
            raise SettingsError(f"--run: [learner] lora_rank = {rank} is above what the vLLM actors serve "
                                f"([actor] max_adapter_rank = {most})")

    # The instances, each with the wiring forge up gives it.
    def _instance(self, name: str, kind: str, wiring: Mapping[str, Any], *, own: Mapping[str, Any] | None = None,
                  keys: Mapping[str, str] | None = None, env: Mapping[str, str] | None = None,
                  pending: frozenset[str] = frozenset()) -> Instance:
        """``own``: values of this instance alone, in place of those forge up derives for every instance (an
        actor's seed); ``keys``: the secrets wired from the run's key files (secret option → kind of key)."""
        overrides = self.overrides[kind]
        wired_keys = WIRED[kind] if keys is None else keys
        key_files = {} if self.keys is None else {n: self.keys.file(k) for n, k in wired_keys.items()}
        own = {k: v for k, v in (own or {}).items() if overrides.sources.get(k, "forge up") == "forge up"}
        try:
            settings = overrides.build(**own, **wiring, **{f"{n}_file": path for n, path in key_files.items()})
        except SettingsError as exc:
            raise SettingsError(f"{name}: {exc}") from None
        sources = {**overrides.sources, **dict.fromkeys(own, "forge up"), **dict.fromkeys(wiring, "wired"),
                   **dict.fromkeys(key_files, "wired")}
        return Instance(name, SERVICES[kind], settings, key_files, {**self.hub_env, **(env or {})}, sources, pending)

    def metrics(self) -> dict[str, Any]:
        return {"metrics_port": 0} if self.config.metrics else {}

    def cache(self) -> Instance:
        return self._instance("cache", "cache", {"dir": self.config.run_dir / "cache", "port": 0, **self.metrics()})

    def learner(self, lane: Lane | None = None, teachers: tuple[str, ...] = (),
                pending: frozenset[str] = frozenset()) -> Instance:
        """The learner of ``lane`` (the run's only one by default), asking the actors at ``teachers`` for its
        teacher's log-probs; a shared run's publishes its adapters."""
        lane = lane or self.lanes()[0]
        secret = self.lane_curves[lane.name][0] if lane.name in self.lane_curves else \
            None if self.curve is None else self.curve.server_secret
        curve = {} if self.curve is None or secret is None else {"weights_key": secret,
                                                                 "weights_clients": self.curve.clients_dir}
        shared = {"lora_publish": "adapters"} if self.shared else {}
        # forge up logs to the trackers itself (forge.app.up.tracking): its learner writes the sample table alone.
        tracking = self.config.tracking
        samples = {"tracker": (), "sample_table_every": tracking.sample_every,
                   "sample_table_size": tracking.sample_size}
        teacher = {"teacher_actor": teachers} if teachers else {}
        keys = {**WIRED["learner"], "teacher_api_key": "actor"} if teachers else None
        return self._instance(lane.instance("learner"), "learner", {
            "pool": lane.directory / "pool", "run_dir": lane.directory / "learner", "create_pool": True,
            "weights_fetch": LOOPBACK_ANY, "weights_announce": LOOPBACK_ANY, "port": 0, **self.metrics(), **curve,
            **shared, **samples, **teacher}, own={"seed": self.config.seed + lane.index, **self._last_step()}, keys=keys,
            env={"OMP_NUM_THREADS": "1"}, pending=pending)

    def _last_step(self) -> dict[str, int]:
        """With --steps N the learner stops at step N itself (the end's held-out reading then reads the policy of
        step N, not one still training on the groups queued meanwhile)."""
        return {"max_steps": self.config.steps} if self.config.steps else {}

    def actor(self, index: int, weights: Mapping[str, str] | None = None, l3_cache: str | None = None,
              pending: frozenset[str] = frozenset(), adapters: tuple[str, ...] = ()) -> Instance:
        """Actor ``index`` of ``roles()``, following the learner's ``weights`` endpoints (fetch, announce), or with
        several runs the runs' ``adapters`` (``NAME=FETCH,ANNOUNCE``), and linked to forge-cache at ``l3_cache``."""
        name, role = self.roles()[index]
        curve = {} if self.curve is None or not (weights or adapters) else {
            "weights_key": self.curve.client_secrets[name],
            **({"weights_server_key": self.curve.server_public} if weights else {})}
        wiring = {"port": 0, "name": name, **dict(weights or {}), **curve, **self.metrics(),
                  **({"adapter": adapters} if adapters else {}),
                  **({"role": role} if role != "both" else {}), **({"l3_cache": l3_cache} if l3_cache else {})}
        keys = {n: k for n, k in WIRED["actor"].items() if l3_cache or n != "l3_api_key"}
        return self._instance(name, "actor", wiring, own={"seed": self.config.seed + index}, keys=keys,
                              pending=pending)

    @property
    def teacher(self) -> str | None:
        """The learner's teacher model (on-policy distillation), None without one."""
        return self.overrides["learner"].values.get("teacher")

    def teacher_names(self) -> list[str]:
        return [f"teacher-{i}" for i in range(self.config.teacher_actors)] if self.teacher is not None else []

    def teacher_actor(self, name: str) -> Instance:
        """An actor serving the teacher: its own model on the backend ``auto`` picks for it (the torch engine for
        Forge's families, vLLM for any other: both score), no weight stream."""
        keys = {n: k for n, k in WIRED["actor"].items() if n != "l3_api_key"}
        return self._instance(name, "actor", {"port": 0, "name": name, "model": self.teacher, "backend": "auto",
                                              **self.metrics()}, keys=keys)

    def gateway(self, name: str, pool: str, actors: list[str], prefill: list[str],
                pending: frozenset[str] = frozenset(), lane: Lane | None = None) -> Instance:
        """``lane``'s gateway ``name`` (``gateway``, ``gateway-eval``) recording into ``pool`` in its directory,
        routing to ``actors`` (and prefilling on ``prefill``); a shared run's samples with its adapter."""
        lane = lane or self.lanes()[0]
        adapter = {"adapter": lane.name} if lane.name else {}
        return self._instance(lane.instance(name), "gateway", {
            "actor": tuple(actors), **({"prefill_actor": tuple(prefill)} if prefill else {}),
            "pool": str(lane.directory / pool), "grpc_port": 0, "http_port": 0, **adapter}, pending=pending)

    def gateways(self, eval_gateway: bool = False) -> list[tuple[str, str]]:
        """(service name, pool) of each lane's gateways: the training one and, for held-out sessions, the eval one."""
        return [("gateway", "pool"), *([("gateway-eval", "eval-pool")] if eval_gateway else [])]

    def adapter_links(self, endpoints: Mapping[str, Mapping[str, str]]) -> tuple[str, ...]:
        """The actors' ``--adapter`` links of a shared run, from each lane's learner endpoints (by lane name)."""
        return tuple(AdapterLink(name, found["weights_fetch"], found["weights_announce"],
                                 self.lane_curves[name][1] if name in self.lane_curves else None).text()
                     for name, found in endpoints.items())

    def check(self, eval_gateway: bool = False) -> list[Instance]:
        """Every instance with the wiring known before anything starts (a gateway's actors stand in as loopback
        addresses): a setting any of them refuses stops the run here, with its instance named."""
        roles, lanes = self.roles(), self.lanes()
        weights = {"weights_fetch": LOOPBACK_ANY, "weights_announce": LOOPBACK_ANY}
        adapters = self.adapter_links({lane.name: weights for lane in lanes}) if self.shared else ()
        teachers = tuple(stand_in(100 + i) for i in range(len(self.teacher_names())))
        found = [*([self.cache()] if self.cache_on else []), *(self.teacher_actor(n) for n in self.teacher_names()),
                 *(self.learner(lane, teachers, frozenset({"teacher_actor"})) for lane in lanes),
                 *(self.actor(i, None if self.shared else weights, stand_in(0) if self.cache_on else None,
                              frozenset({*weights, "l3_cache", "adapter"}), adapters) for i in range(len(roles)))]
        serving = [stand_in(1 + i) for i, (_, role) in enumerate(roles) if role != "prefill"]
        prefill = [stand_in(1 + i) for i, (_, role) in enumerate(roles) if role == "prefill"]
        found += [self.gateway(name, pool, serving, prefill, frozenset({"actor", "prefill_actor"}), lane)
                  for lane in lanes for name, pool in self.gateways(eval_gateway)]
        for instance in found:
            if instance.service.kind == "actor":        # what its backend cannot do (vLLM not installed, ...)
                try:
                    backend, why = pick_backend(instance.settings.backend, instance.settings.model)
                    factory_for(backend).check(instance.settings)
                except ValueError as exc:
                    picked = f"auto picked {backend} ({why})" if instance.settings.backend == "auto" else backend
                    raise SettingsError(f"{instance.name}: --backend {picked}: {exc}") from None
        return found
