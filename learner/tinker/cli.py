"""``forge-tinker``: serve Thinking Machines' Tinker API, so that the official ``tinker`` SDK and tinker-cookbook
recipes train on this machine's models. The command is the process's composition root: its settings
(``TinkerConfig``) in; the training part (``LearnerTraining``: LoRA adapters on shared base models, under the run
directory), the sampling part (``ActorSampling``: Forge's actors, when given), and the server out."""

from __future__ import annotations

import logging

import click

from forge.cli.common import check_port_option, entry_point, setup_logging, write_ready_file
from forge.cli.options import settings_command
from forge.learner.tinker.config import TinkerConfig

log = logging.getLogger("forge.tinker")


def training_device(device: str, dtype: str) -> tuple[str, str]:
    """``auto`` resolved: a GPU when there is one (bfloat16), else the CPU (float32)."""
    import torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if dtype == "auto":
        dtype = "float32" if device == "cpu" else "bfloat16"
    return device, dtype


@settings_command("tinker", TinkerConfig)
def tinker(config: TinkerConfig) -> None:
    """Serve the Tinker API (TINKER_BASE_URL=http://HOST:PORT, TINKER_API_KEY=one of the --api-key keys): clients
    create LoRA models on the --base-model models, train them with forward_backward and optim_step under Tinker's
    losses, save and load their state under --run-dir, and sample from saved weights on the --actor actors. What a
    key creates only that key can see."""
    setup_logging(config.log_level)
    check_port_option(config.host, config.port, "--port")
    check_port_option(config.host, config.grpc_port, "--grpc-port")
    from forge.learner.tinker.server import TinkerServer
    from forge.learner.tinker.training import LearnerTraining

    device, dtype = training_device(config.device, config.dtype)
    training = LearnerTraining(config.run_dir, device=device, dtype=dtype, token_budget=config.token_budget)
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
