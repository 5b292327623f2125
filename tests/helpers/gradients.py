"""Capture the gradients an optimizer step is about to use (the equivalence tests compare gradients, which Adam's
scale-free first update would hide)."""

from __future__ import annotations

import torch


def capture_gradients(trainer, model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Make ``trainer``'s optimizer record ``model``'s gradients, gathered whole if sharded (a collective: every
    rank's step calls it), each time it steps; returns the dict it fills."""
    grads: dict[str, torch.Tensor] = {}
    step = trainer.optimizer.step

    def capture():
        for name, parameter in model.named_parameters():
            if parameter.grad is not None:
                grad = parameter.grad
                grads[name] = (grad.full_tensor() if hasattr(grad, "full_tensor") else grad).detach().clone()
        return step()

    trainer.optimizer.step = capture
    return grads
