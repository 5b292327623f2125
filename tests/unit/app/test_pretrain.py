"""The built-in models' pre-training: its losses (the load-balancing one only with experts) and that it trains
every part of a model with experts, routers included."""

from __future__ import annotations

import pytest
import torch

from forge.app.pretrain import batches, losses, pretrain
from forge.checkpoints import builtin_model, tiny_tokenizer


@pytest.mark.parametrize("name", ["tiny", "tiny-moe"])
def test_the_losses_of_a_demonstration_batch(name):
    model = builtin_model(name, seed=1)
    ids, mask = next(batches(tiny_tokenizer(), 2, seed=0))
    main, draft, balance = losses(model, ids, mask)
    assert torch.isfinite(main) and torch.isfinite(draft) and main.item() > 0
    if name == "tiny":
        assert balance.item() == 0.0
    else:
        assert balance.item() >= 1.0 - 1e-6           # 1 at a uniform load, more otherwise
        main.backward()
        assert model.model.layers[0].mlp.gate.weight.grad.abs().sum() > 0


def test_pretraining_the_moe_model_moves_its_routers_and_experts():
    before = builtin_model("tiny-moe", seed=0).state_dict()
    after = pretrain(steps=2, batch_size=2, lr=1e-3, seed=0, progress=False, name="tiny-moe").state_dict()
    for name in ("model.layers.0.mlp.gate.weight", "model.layers.3.mlp.experts.gate_up_proj",
                 "mtp.0.layer.mlp.experts.down_proj"):
        assert not torch.equal(before[name], after[name]), name
