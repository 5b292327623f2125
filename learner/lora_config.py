"""The learner's LoRA settings (``[learner]`` ``lora_*``): the adapters' rank, scale, dropout, target projections and
what each weight version sends the actors. Apart from ``forge.learner.lora`` (the adapters themselves, torch and
peft) so that reading the learner's settings imports neither."""

from __future__ import annotations

from dataclasses import dataclass

from forge.settings import Settings, setting

DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True, kw_only=True)
class LoraConfig(Settings):
    rank: int = setting(0, flag="lora-rank", min=0,
                        help="Train rank-R LoRA adapters on the policy's projections instead of every weight (0: "
                             "full fine-tuning).")
    alpha: float = setting(16.0, flag="lora-alpha", min=0.0,
                           help="LoRA's scale numerator: an adapter's update is scaled by alpha / rank.")
    dropout: float = setting(0.0, flag="lora-dropout", min=0.0, max=0.99,
                             help="Dropout on each adapter's input while training.")
    targets: tuple[str, ...] = setting(DEFAULT_TARGETS, flag="lora-targets",
                                       help="Names of the linear modules that get adapters (repeatable; the last "
                                            "part of a module's name, e.g. q_proj).")
    publish: str = setting("merged", flag="lora-publish", choices=("merged", "adapters"),
                           help="What each version sends the actors: the whole model with the adapters merged (any "
                                "backend), or the adapters alone, which the actor (torch engine or vLLM) merges onto "
                                "the base it started from (megabytes instead of the model).")

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank

    def peft_config(self, modules: list[str]):
        """The same adapter, on ``modules`` (whole names), as peft describes it (``peft.LoraConfig``)."""
        import peft

        return peft.LoraConfig(r=self.rank, lora_alpha=self.alpha, lora_dropout=self.dropout, bias="none",
                               target_modules=modules, task_type="CAUSAL_LM")
