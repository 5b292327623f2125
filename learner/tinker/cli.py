"""``forge-tinker``: serve Thinking Machines' Tinker API, so that the official ``tinker`` SDK and tinker-cookbook
recipes train on this machine's models. The command is the process's composition root: its settings
(``TinkerConfig``) in; the training part (``LearnerTraining``: LoRA adapters on shared base models, under the run
directory), the sampling part (``ActorSampling``: Forge's actors, when given), and the server out.

Before anything starts, every ``--base-model`` is made ready to load, as the entry points that a user runs do with
the model they are given (``forge up``, ``forge rollout``; the learner and the actors only read the cache): a Hugging
Face id not in huggingface_hub's cache yet is fetched into it (with ``HF_HUB_OFFLINE`` set, or the Hub out of reach,
the cache alone serves), and each model is checked as the learner checks its own (``trainable_model``: a family Forge
or transformers implements, weights present). One that cannot be had stops the command in one line, exit status 2,
before a client could be told it is offered."""

from __future__ import annotations

import logging

import click

from forge import variables
from forge.cli.common import FetchFailed, check_port_option, entry_point, setup_logging, write_ready_file
from forge.cli.options import settings_command
from forge.learner.tinker.config import TinkerConfig
from forge.learner.tinker.types import Training

log = logging.getLogger("forge.tinker")


def training_device(device: str, dtype: str) -> tuple[str, str]:
    """``auto`` resolved: a GPU when there is one (bfloat16), else the CPU (float32)."""
    import torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if dtype == "auto":
        dtype = "float32" if device == "cpu" else "bfloat16"
    return device, dtype


def have_base_models(names: tuple[str, ...]) -> None:
    """Each of ``names`` ready to load: a Hugging Face id fetched into the cache unless it is there already, every
    model checked as the learner checks its own; FetchFailed, in one line, for the first that cannot be had."""
    from forge.checkpoints import HubError, ModelNotFound, fetch_snapshot, hub_id_of, trainable_model
    from forge.checkpoints.hub import cached_snapshot

    for name in names:
        try:
            hub = hub_id_of(name)
            if hub is not None:
                try:
                    directory = cached_snapshot(hub)
                except HubError:
                    log.info("base model %s: fetching it into the Hugging Face cache", name)
                    directory = fetch_snapshot(hub, progress=False)
                log.info("base model %s: %s", name, directory)
            trainable_model(name)
        except (HubError, ModelNotFound) as exc:
            raise FetchFailed(str(exc)) from None


@settings_command("tinker", TinkerConfig)
def tinker(config: TinkerConfig) -> None:
    """Serve the Tinker API (TINKER_BASE_URL=http://HOST:PORT, TINKER_API_KEY=one of the --api-key keys): clients
    create LoRA models on the --base-model models, train them with forward_backward and optim_step under Tinker's
    losses, save and load their state under --run-dir, and sample from saved weights on the --actor actors. What a
    key creates only that key can see. With --nproc N, N ranks train (rank 0 serves)."""
    setup_logging(config.log_level)
    if variables.read("RANK") in (None, "0"):          # rank 0 serves; the other ranks only train
        check_port_option(config.host, config.port, "--port")
        check_port_option(config.host, config.grpc_port, "--grpc-port")
    have_base_models(config.base_models)
    from forge.learner.tinker.rank_launch import close_ranks, open_ranks, run_under_torchrun
    from forge.learner.tinker.training import LearnerTraining

    if config.nproc > 1 and not variables.is_set("WORLD_SIZE"):
        run_under_torchrun(config)
    device, dtype = training_device(config.device, config.dtype)
    if config.nproc > 1 or int(variables.read("WORLD_SIZE")) > 1:
        training = open_ranks(config, dtype)            # a rank > 0 follows rank 0 there, then exits
        try:
            serve(config, training)
        finally:
            close_ranks(training)
        return
    serve(config, LearnerTraining(config.run_dir, device=device, dtype=dtype, token_budget=config.token_budget))


def serve(config: TinkerConfig, training: Training) -> None:
    """The server over ``training`` (and the actors' sampling, when given) until a stop signal."""
    from forge.learner.tinker.server import TinkerServer

    sampling = None
    if config.actors:
        from forge.learner.tinker.sampling import ActorSampling

        try:
            sampling = ActorSampling(training, config.actors, config.actor_api_key, config.weights_fetch,
                                     config.weights_announce)
        except (OSError, ValueError) as exc:
            raise click.ClickException(f"sampling cannot start: {exc}") from exc
    try:
        server = TinkerServer(config, training, sampling)
    except (OSError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc

    def ready() -> None:
        if config.ready_file:
            weights = ({"weights_fetch": sampling.fetch_endpoint, "weights_announce": sampling.announce_endpoint}
                       if sampling is not None else {})
            write_ready_file(config.ready_file, address=server.address, base_url=server.base_url,
                             metrics_url=f"{server.base_url}/metrics", **weights)

    server.run_until_signal(on_ready=ready)


main = entry_point(tinker, "tinker")
