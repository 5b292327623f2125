"""``Training`` on Forge's learner: the models Tinker clients train, each a LoRA adapter on a base model loaded once
and shared (``forge.learner.tinker.adapters``), its batches run through the learner's prefix-tree packing
(``packed_forward``) under Tinker's losses (``tinker_losses``), its gradients added up until ``optim_step`` (AdamW,
as Tinker's Adam is), and its state saved under the run directory (``checkpoints``).

Every model a client creates is recorded in the run directory's registry before ``create_model`` returns, so a
server started again on the same directory knows every model and checkpoint: a model is put back on its base when
first used (a fresh adapter from its seed), and ``load_state`` with the optimizer resumes it exactly.

Every method checks what the client sent before it changes anything, and raises ``UserError`` (``NotFound`` for an
unknown model or checkpoint) for what is wrong. Calls come one at a time (the server serialises them).
"""

from __future__ import annotations

import json
import logging
import math
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from forge.checkpoints.reference import ModelNotFound, resolve_model
from forge.learner.parallel import Distributed
from forge.learner.tinker.adapters import LORA_ALPHA, SharedBase, adapter_version, check_spec, read_adapter
from forge.learner.tinker.checkpoints import KINDS, OPTIMIZER_FILE, STATE_FILE, CheckpointStore, new_model_id
from forge.learner.tinker.packed_forward import packed_logprobs
from forge.learner.tinker.tinker_losses import check_datum, elementwise_loss, resolve_loss, term_inputs
from forge.learner.tinker.types import (
    AdamSpec,
    Checkpoint,
    Datum,
    ForwardResult,
    LoraSpec,
    ModelInfo,
    NotFound,
    Training,
    UserError,
)

log = logging.getLogger(__name__)


@dataclass
class LoadedModel:
    """A model on its base: its optimizer (made at its first step) and its step count."""

    base: SharedBase
    optimizer: torch.optim.AdamW | None = None
    step: int = 0


def checked_prompt(tokens: list[int], top_k: object, vocab_size: int) -> np.ndarray:
    """A prompt to score, as ids: a non-empty list of token ids below ``vocab_size``, with a non-negative ``top_k``;
    UserError otherwise."""
    ids = np.asarray(tokens)
    if ids.ndim != 1 or ids.size == 0 or ids.dtype.kind not in "iu" or ids.min() < 0 or ids.max() >= vocab_size:
        raise UserError(f"the prompt must be a non-empty list of token ids below {vocab_size}")
    if not isinstance(top_k, int) or top_k < 0:
        raise UserError(f"top_k must be a non-negative integer, not {top_k!r}")
    return ids


class LearnerTraining(Training):
    def __init__(self, run_dir: Path, *, device: str = "cpu", dtype: str = "float32", token_budget: int = 8192,
                 distributed: Distributed | None = None) -> None:
        """``distributed``: this process's rank of several (``forge.learner.tinker.ranks``), whose forward passes
        keep in step with the other ranks'; None: one process."""
        if token_budget < 1:
            raise ValueError("token_budget must be positive")
        self.device, self.dtype, self.token_budget = device, dtype, token_budget
        self.distributed = distributed or Distributed()
        self.store = CheckpointStore(Path(run_dir))
        self.infos: dict[str, ModelInfo] = {}
        self.bases: dict[str, SharedBase] = {}
        self.loaded: dict[str, LoadedModel] = {}
        self.lock = threading.RLock()
        for record in self.store.records():
            try:
                self.infos[record["model_id"]] = self._describe(record["model_id"], record["owner"],
                                                                record["base_model"], record["lora"])
            except ModelNotFound as exc:
                log.warning("model %s: its base %s cannot be found (%s)", record["model_id"], record["base_model"], exc)

    # Models.
    def _describe(self, model_id: str, owner: str, base_model: str, lora: LoraSpec) -> ModelInfo:
        """The model's info. Its ``tokenizer_id`` is what the SDK's ``get_tokenizer`` gives
        ``AutoTokenizer.from_pretrained``: a directory's absolute path (the built-in model's asset directory), or a
        Hub model's repository id, which a client with the same cache or ``HF_ENDPOINT`` loads the same tokenizer
        from (the SDK passes no revision: a model named ``org/name@rev`` gives its default branch's tokenizer)."""
        ref = resolve_model(base_model)
        tokenizer = ref.hub.repo_id if ref.hub is not None else str(ref.directory)
        return ModelInfo(model_id=model_id, owner=owner, base_model=base_model, lora=lora, tokenizer_id=tokenizer,
                         model_name=base_model)

    def _base(self, base_model: str) -> SharedBase:
        """The shared base ``base_model`` names, loaded on first use (UserError when it cannot be found)."""
        try:
            key = resolve_model(base_model).model_id
            if key not in self.bases:
                self.bases[key] = SharedBase(base_model, self.device, self.dtype)
        except ModelNotFound as exc:       # a Hub model not in the cache: "ORG/NAME: not in the Hugging Face cache ..."
            raise UserError(f"base model {exc}") from None
        except ValueError as exc:           # a checkpoint Forge cannot load (its config, its family, its weights)
            raise UserError(f"base model {base_model!r} cannot be loaded: {exc}") from None
        return self.bases[key]

    def create_model(self, owner: str, base_model: str, lora: LoraSpec) -> ModelInfo:
        with self.lock:
            check_spec(lora)
            if not isinstance(base_model, str) or not base_model:
                raise UserError("base_model must name a model")
            base = self._base(base_model)
            model_id = new_model_id()
            info = self._describe(model_id, owner, base_model, lora)
            base.add(model_id, lora)
            try:
                self.store.register(model_id, owner, base_model, lora)
            except BaseException:
                base.remove(model_id)
                raise
            self.infos[model_id] = info
            self.loaded[model_id] = LoadedModel(base)
            return info

    def model_info(self, model_id: str) -> ModelInfo:
        info = self.infos.get(model_id) if isinstance(model_id, str) else None
        if info is None:
            raise NotFound(f"unknown model {model_id!r}")
        return info

    def models(self, owner: str) -> list[ModelInfo]:
        return [info for info in self.infos.values() if info.owner == owner]

    def _model(self, model_id: str) -> LoadedModel:
        """The model on its base and active (put back on its base first after a restart or ``unload``)."""
        info = self.model_info(model_id)
        model = self.loaded.get(model_id)
        if model is None:
            base = self._base(info.base_model)
            base.add(model_id, info.lora)
            model = self.loaded[model_id] = LoadedModel(base)
        model.base.activate(model_id)
        return model

    def unload(self, model_id: str) -> None:
        with self.lock:
            self.model_info(model_id)
            model = self.loaded.pop(model_id, None)
            if model is not None:
                model.base.remove(model_id)

    # Forward passes.
    def forward(self, model_id: str, data: list[Datum], loss_fn: str, loss_fn_config: dict[str, float] | None,
                backward: bool) -> ForwardResult:
        with self.lock:
            self.check_forward(model_id, data, loss_fn, loss_fn_config)
            logprobs, losses = self.forward_terms(model_id, data, loss_fn, loss_fn_config, backward)
            return ForwardResult(outputs=_per_datum(data, logprobs, losses),
                                 metrics={"loss:sum": float(losses.astype(np.float64).sum())})

    def check_forward(self, model_id: str, data: list[Datum], loss_fn: str,
                      loss_fn_config: dict[str, float] | None) -> None:
        """UserError for a forward pass that cannot run as asked (nothing changes; the base may be loaded)."""
        info = self.model_info(model_id)
        loss = resolve_loss(loss_fn, loss_fn_config)
        if not data:
            raise UserError("no data: a forward pass needs at least one datum")
        vocab = self._base(info.base_model).vocab_size
        for i, datum in enumerate(data):
            check_datum(loss, datum, i, vocab)

    def forward_terms(self, model_id: str, data: list[Datum], loss_fn: str, loss_fn_config: dict[str, float] | None,
                      backward: bool) -> tuple[np.ndarray, np.ndarray]:
        """The flattened log-probabilities and loss terms of checked ``data`` (which may be empty on a rank of
        several, whose passes keep in step with the others'); with ``backward`` the gradient is added."""
        loss = resolve_loss(loss_fn, loss_fn_config)
        model = self._model(model_id)
        device = model.base.policy.output_weight.device
        inputs = [term_inputs(loss, datum) for datum in data]
        flat = {key: torch.from_numpy(np.concatenate([i[key] for i in inputs])) for key in inputs[0]} if data else {}
        pieces: list[tuple[np.ndarray, torch.Tensor]] = []

        def on_batch(logprobs: torch.Tensor, index: np.ndarray) -> torch.Tensor:
            rows = torch.from_numpy(index)
            terms = elementwise_loss(loss, logprobs.float(), {k: v[rows].to(device) for k, v in flat.items()})
            pieces.append((index, terms.detach().cpu()))
            return terms.sum()

        with torch.enable_grad() if backward else torch.no_grad():
            logprobs = packed_logprobs(model.base.policy, [d.tokens for d in data],
                                       [d.inputs["target_tokens"] for d in data], self.token_budget, on_batch,
                                       device, self.distributed)
        losses = np.zeros_like(logprobs)
        for index, terms in pieces:
            losses[index] = terms.numpy()
        return logprobs, losses

    # The optimizer.
    def optim_step(self, model_id: str, adam: AdamSpec) -> dict[str, float]:
        with self.lock:
            self.model_info(model_id)
            _check_adam(adam)
            model = self._model(model_id)
            parameters = list(model.base.parameters(model_id).values())
            if model.optimizer is None:
                model.optimizer = torch.optim.AdamW(parameters, lr=adam.learning_rate)
            for group in model.optimizer.param_groups:
                group.update(lr=adam.learning_rate, betas=(adam.beta1, adam.beta2), eps=adam.eps,
                             weight_decay=adam.weight_decay)
            clip = adam.grad_clip_norm if adam.grad_clip_norm > 0 else math.inf
            norm = float(torch.nn.utils.clip_grad_norm_(parameters, clip))
            model.optimizer.step()
            model.optimizer.zero_grad(set_to_none=True)
            model.step += 1
            return {"grad_norm:mean": norm, "learning_rate:mean": adam.learning_rate, "step:max": float(model.step)}

    # Saved state.
    def _name(self, model_id: str, segment: str, name: str | None, step: int) -> str:
        if name is not None:
            return name
        taken = {c.checkpoint_id for c in self.store.list(model_id)}
        name, n = f"{step:06d}", 1
        while f"{segment}/{name}" in taken:
            name, n = f"{step:06d}-{n}", n + 1
        return name

    def save_state(self, model_id: str, name: str | None) -> Checkpoint:
        with self.lock:
            info = self.model_info(model_id)
            model = self._model(model_id)
            name = self._name(model_id, "weights", name, model.step)
            self.store.directory(model_id, "weights", name)          # the name checked before anything is written
            names = list(model.base.parameters(model_id))

            def fill(staging: Path) -> None:
                model.base.save_adapter(model_id, staging)
                if model.optimizer is not None:
                    torch.save(model.optimizer.state_dict(), staging / OPTIMIZER_FILE)
                state = {"step": model.step, "model_id": model_id, "base_model": info.base_model,
                         "lora": asdict(info.lora), "parameters": names}
                (staging / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")

            return self.store.save(model_id, "weights", name, fill)

    def save_sampler(self, model_id: str, name: str | None) -> Checkpoint:
        with self.lock:
            self.model_info(model_id)
            model = self._model(model_id)
            name = self._name(model_id, "sampler_weights", name, model.step)
            self.store.directory(model_id, "sampler_weights", name)
            return self.store.save(model_id, "sampler_weights", name,
                                   lambda staging: model.base.save_adapter(model_id, staging))

    def load_state(self, model_id: str, path: str, with_optimizer: bool) -> None:
        with self.lock:
            self.model_info(model_id)
            source, segment, directory = self.store.find(path)
            self.model_info(source)
            if with_optimizer and KINDS[segment] != "training":
                raise UserError(f"{path} holds sampler weights, no optimizer state: load a tinker://.../weights/... "
                                "checkpoint")
            weights = read_adapter(directory)
            model = self._model(model_id)
            saved = _read_state(directory)
            optimizer_state = None
            if with_optimizer and (directory / OPTIMIZER_FILE).is_file():
                optimizer_state = torch.load(directory / OPTIMIZER_FILE, map_location="cpu", weights_only=True)
            previous = model.base.state(model_id)
            model.base.load(model_id, weights)          # UserError (nothing changed) unless the adapter fits
            parameters = list(model.base.parameters(model_id).values())
            try:
                optimizer = None
                if optimizer_state is not None:
                    optimizer = torch.optim.AdamW(parameters)
                    optimizer.load_state_dict(optimizer_state)
            except (ValueError, KeyError) as exc:
                model.base.load(model_id, previous)
                raise UserError(f"{path}: its optimizer state does not fit this model ({exc})") from None
            for parameter in parameters:
                parameter.grad = None
            model.optimizer = optimizer
            model.step = int(saved.get("step", 0))

    def sampler_weights(self, path: str) -> tuple[ModelInfo, dict[str, object]]:
        with self.lock:
            model_id, _, directory = self.store.find(path)
            info = self.model_info(model_id)
            return info, dict(adapter_version(read_adapter(directory), info.lora.rank))

    def checkpoints(self, model_id: str) -> list[Checkpoint]:
        with self.lock:
            self.model_info(model_id)
            return self.store.list(model_id)

    def delete_checkpoint(self, model_id: str, checkpoint_id: str) -> None:
        with self.lock:
            self.model_info(model_id)
            self.store.delete(model_id, checkpoint_id)

    # Prompt log-probabilities.
    def prompt_logprobs(self, base_model: str, sampler_path: str | None, tokens: list[int],
                        top_k: int = 0) -> tuple[list[float | None], list[list[tuple[int, float]] | None] | None]:
        with self.lock:
            if sampler_path is not None:
                model_id, _, directory = self.store.find(sampler_path)
                base_model = self.model_info(model_id).base_model
            base = self._base(base_model)
            ids = checked_prompt(tokens, top_k, base.vocab_size)
            if sampler_path is None:
                return _prompt_logprobs(base, None, ids, top_k)
            scratch = f"sampler-{new_model_id()}"
            base.add(scratch, self.model_info(model_id).lora)
            try:
                base.load(scratch, read_adapter(directory))
                return _prompt_logprobs(base, scratch, ids, top_k)
            finally:
                base.remove(scratch)


@torch.no_grad()
def _prompt_logprobs(base: SharedBase, adapter: str | None, ids: np.ndarray,
                     top_k: int) -> tuple[list[float | None], list[list[tuple[int, float]] | None] | None]:
    base.activate(adapter)
    device = base.policy.output_weight.device
    input_ids = torch.as_tensor(ids, dtype=torch.long, device=device).unsqueeze(0)
    logprobs = torch.log_softmax(base.policy.logits(base.policy(input_ids)[0, :-1]).float(), dim=-1)
    picked = logprobs.gather(-1, input_ids[0, 1:].unsqueeze(-1)).squeeze(-1).cpu().tolist()
    top = None
    if top_k > 0:
        values, indices = torch.topk(logprobs, min(top_k, logprobs.shape[-1]), dim=-1)
        top = [None] + [list(zip(i, v, strict=True)) for i, v in zip(indices.tolist(), values.tolist(), strict=True)]
    return [None, *picked], top


def _per_datum(data: list[Datum], logprobs: np.ndarray, losses: np.ndarray) -> list[dict[str, np.ndarray]]:
    outputs, start = [], 0
    for datum in data:
        shape = np.asarray(datum.inputs["target_tokens"]).shape
        stop = start + int(np.prod(shape))
        outputs.append({"logprobs": logprobs[start:stop].reshape(shape).astype(np.float32),
                        "elementwise_loss": losses[start:stop].reshape(shape).astype(np.float32)})
        start = stop
    return outputs


def _check_adam(adam: AdamSpec) -> None:
    values = asdict(adam)
    if not all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in values.values()):
        raise UserError(f"Adam's parameters must be finite numbers: {values}")
    if adam.learning_rate < 0 or adam.eps < 0 or adam.weight_decay < 0 or adam.grad_clip_norm < 0:
        raise UserError("learning_rate, eps, weight_decay and grad_clip_norm must not be negative")
    if not (0 <= adam.beta1 < 1 and 0 <= adam.beta2 < 1):
        raise UserError("beta1 and beta2 must lie in [0, 1)")


def _read_state(directory: Path) -> dict:
    path = directory / STATE_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


__all__ = ["LORA_ALPHA", "LearnerTraining"]
