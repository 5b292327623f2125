"""The model an actor serves, by the reference it was given (a checkpoint directory or a built-in model): the id it
serves under and the loaded policy. Shared by the actor's factory, the engine core and the benches."""

from __future__ import annotations

from typing import TYPE_CHECKING

from forge.sampling.grammar import Grammars

if TYPE_CHECKING:
    from forge.model.policy import Policy


def model_id_of(model: str) -> str:
    """The id ``model`` serves under (KV salts, stats); raises ModelNotFound (a ValueError) when it names no
    model. Loads nothing."""
    from forge.checkpoints import resolve_model

    return resolve_model(model).model_id


def load_policy(model: str, device: str, dtype: str) -> tuple[Policy, str]:
    """(model, id) for ``model``: a checkpoint directory, or a built-in model (its shipped weights, else a fresh
    init)."""
    from forge.checkpoints import load_model

    policy, ref = load_model(model, dtype=dtype, device=device)
    return policy, ref.model_id


def grammars_of(model: str, policy: Policy) -> Grammars:
    """Structured-output grammars compiled against the tokenizer of ``model`` (the loaded ``policy``)."""
    from forge.checkpoints import resolve_model

    config = policy.config
    return Grammars(resolve_model(model).directory, config.vocab_size, tuple(config.eos_token_ids))
