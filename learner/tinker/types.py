"""What the Tinker API's server asks of Forge's parts, apart from the wire: the request values once decoded and checked
(a datum's tokens and loss inputs, a LoRA configuration, Adam's parameters, sampling parameters), what comes back
(a forward pass's per-datum outputs and metrics, sampled sequences, model and checkpoint descriptions), and the two
extension points the server is composed of: ``Training`` (models a client trains: LoRA adapters on a shared base,
gradients added up until an optimizer step, saved and loaded state) and ``Sampling`` (sequences from a saved
sampler's weights, served by Forge's actors).

The server (``forge.learner.tinker.server``) decodes the SDK's JSON and protobuf bodies into these values, checks who
owns what, and runs the calls in each client's order; ``Training`` and ``Sampling`` never see the wire."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Literal

import numpy as np


class UserError(ValueError):
    """A request that cannot be served as asked (unknown loss, bad shapes, unknown or foreign ids, a path outside the
    client's checkpoints): answered with the SDK's user error category, and nothing changes."""


class NotFound(UserError):
    """A model, checkpoint or sampler that does not exist, or that belongs to another client (never told apart)."""


@dataclass(frozen=True)
class LoraSpec:
    rank: int
    seed: int | None = None
    train_mlp: bool = True
    train_attn: bool = True
    train_unembed: bool = True


@dataclass(frozen=True)
class AdamSpec:
    learning_rate: float = 1e-4
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-12
    weight_decay: float = 0.0
    grad_clip_norm: float = 0.0          # 0: no clipping


@dataclass(frozen=True)
class Datum:
    """One sequence of a forward or forward_backward batch: its input tokens (``model_input``'s text chunks joined)
    and its loss inputs as dense arrays (``target_tokens`` int64, ``weights``/``advantages``/``logprobs`` float32,
    ...), each with the tokens' length unless the loss says otherwise."""

    tokens: np.ndarray                               # int64 [T]
    inputs: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class ForwardResult:
    """Per datum, the loss function's outputs (``logprobs`` float32 [T], ``elementwise_loss`` ...), and the batch's
    metrics keyed ``name:reduction`` (always ``loss:sum``)."""

    outputs: list[dict[str, np.ndarray]]
    metrics: dict[str, float]
    output_type: str = "TensorData"


@dataclass(frozen=True)
class ModelInfo:
    model_id: str
    owner: str                       # the client that created it (a digest of its API key, never the key)
    base_model: str                  # as the client named it
    lora: LoraSpec
    tokenizer_id: str                # what the SDK's get_tokenizer loads: a Hugging Face id or a local directory
    model_name: str                  # the base model's name as the SDK shows it


@dataclass(frozen=True)
class Checkpoint:
    """A saved state (``kind`` "training": adapter and optimizer) or sampler weights ("sampler": adapter alone)."""

    model_id: str
    checkpoint_id: str               # "weights/NAME" or "sampler_weights/NAME"
    kind: Literal["training", "sampler"]
    path: str                        # tinker://MODEL_ID/weights/NAME
    size_bytes: int
    created_unix: float
    public: bool = False


@dataclass(frozen=True)
class SampleParams:
    max_tokens: int | None = None
    temperature: float = 1.0
    top_k: int = -1                  # -1: no truncation
    top_p: float = 1.0
    seed: int | None = None
    stop_strings: tuple[str, ...] = ()
    stop_tokens: tuple[int, ...] = ()
    stop_at_eos: bool = True         # the SDK's ``stop=[]``: no stop at all, the end-of-sequence token included


@dataclass(frozen=True)
class SampledSequence:
    tokens: list[int]
    logprobs: list[float]
    stop_reason: Literal["length", "stop"]


class Training(ABC):
    """The models clients train. Calls on one model come in the client's order (the server sees to it), one at a
    time; calls on different models may interleave. Every method raises ``UserError`` (or ``NotFound``) for what
    the client got wrong, before changing anything."""

    @abstractmethod
    def create_model(self, owner: str, base_model: str, lora: LoraSpec) -> ModelInfo: ...

    @abstractmethod
    def model_info(self, model_id: str) -> ModelInfo: ...

    @abstractmethod
    def models(self, owner: str) -> list[ModelInfo]: ...

    @abstractmethod
    def forward(self, model_id: str, data: list[Datum], loss_fn: str, loss_fn_config: dict[str, float] | None,
                backward: bool) -> ForwardResult:
        """The loss's outputs on ``data``; with ``backward`` its gradient is added to the model's (until
        ``optim_step``)."""

    @abstractmethod
    def optim_step(self, model_id: str, adam: AdamSpec) -> dict[str, float]:
        """One Adam step on the gradients added up since the last one, which are then cleared."""

    @abstractmethod
    def save_state(self, model_id: str, name: str | None) -> Checkpoint:
        """The adapter and the optimizer's state, on disk (fsynced) before it returns."""

    @abstractmethod
    def load_state(self, model_id: str, path: str, with_optimizer: bool) -> None: ...

    @abstractmethod
    def save_sampler(self, model_id: str, name: str | None) -> Checkpoint:
        """The adapter alone, for sampling (``tinker://MODEL_ID/sampler_weights/NAME``)."""

    @abstractmethod
    def sampler_weights(self, path: str) -> tuple[ModelInfo, dict[str, object]]:
        """The model a sampler path was saved from and its adapter's tensors (as ``save_sampler`` wrote them)."""

    @abstractmethod
    def checkpoints(self, model_id: str) -> list[Checkpoint]: ...

    @abstractmethod
    def delete_checkpoint(self, model_id: str, checkpoint_id: str) -> None: ...

    @abstractmethod
    def prompt_logprobs(self, base_model: str, sampler_path: str | None, tokens: list[int],
                        top_k: int = 0) -> tuple[list[float | None], list[list[tuple[int, float]] | None] | None]:
        """log p of each prompt token given the ones before it (None for the first), under the base model or a
        sampler's weights, and the top-k alternatives at each position when ``top_k`` > 0."""

    @abstractmethod
    def unload(self, model_id: str) -> None:
        """Free the model's memory; its saved checkpoints stay."""


class Sampling(ABC):
    """Sequences from a base model or a saved sampler's weights, served by Forge's actors."""

    @abstractmethod
    async def sample(self, base_model: str, sampler_path: str | None, prompt: list[int], num_samples: int,
                     params: SampleParams) -> list[SampledSequence]: ...

    @abstractmethod
    async def forget(self, sampler_path: str) -> bool:
        """Stop serving what was loaded from ``sampler_path`` (deleted, or written again), so that the next sample
        reads it again; True when something was served from it."""

    @abstractmethod
    async def close(self) -> None: ...
