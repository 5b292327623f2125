"""The trainer's settings (``[learner]``, the ``trainer`` group): the optimiser, micro-batches and packed trees,
context parallelism, expert routing, the step budget, checkpoints and publishing, and staleness. Apart from the
trainer (torch) so that reading the learner's settings does not import it."""

from __future__ import annotations

from dataclasses import dataclass

from forge.settings import Settings, setting

ROUTING_MODES = ("replay", "recompute")      # see forge.learner.expert_replay


@dataclass(frozen=True, kw_only=True)
class TrainerConfig(Settings):
    lr: float = setting(1e-5, min=0, min_open=True, help="Learning rate (AdamW).")
    warmup_steps: int = setting(0, min=0, help="Linear learning-rate warm-up over this many steps.")
    weight_decay: float = setting(0.0, min=0, help="AdamW weight decay.")
    grad_clip: float = setting(1.0, min=0, min_open=True, help="Clip the gradients' global norm to this.")
    micro_batch_tokens: int = setting(8192, min=16, help="Token budget of one micro-batch (of one packed prefix tree "
                                                         "with --tree).")
    tree: bool = setting(True, help="Merge the batch's shared prefixes into packed tries and train them once (exact); "
                                    "--no-tree trains sample by sample.")
    context_parallel: int = setting(1, min=1, help="Split the tokens of every packed tree across this many "
                                                   "consecutive ranks, which exchange keys and values layer by "
                                                   "layer: a sequence needs 1 / N of a rank's memory (N must divide "
                                                   "the job's processes; needs --tree).")
    tree_stem: bool = setting(True, help="With --tree: compute the context several packed trees of a step share once "
                                         "(its activations are held for the step); --no-tree-stem recomputes it in "
                                         "every tree.")
    routing: str = setting("replay", choices=ROUTING_MODES,
                           help="Models with experts: train every token through the experts its actor chose "
                                "(replay) or let the routers choose again (recompute); the mismatch rate is "
                                "recorded either way.")
    activation_checkpointing: bool = setting(False, help="Keep only each decoder layer's input for the backward pass "
                                                         "and recompute the layer there: activation memory of one "
                                                         "layer instead of all, for about a third more compute.")
    max_steps: int = setting(0, min=0, help="Stop after this many steps (0 = until stopped).")
    checkpoint_every: int = setting(10, min=1, help="Steps between checkpoints.")
    publish_every: int = setting(1, min=1, help="Steps between published weight versions.")
    max_staleness: int | None = setting(None, min=0, help="Versions a sample may lag behind the learner [default: no "
                                                          "limit]; 0 trains only on samples of the current version.")
    staleness_policy: str = setting("drop", choices=("drop", "keep"),
                                    help="What to do with samples staler than --max-staleness.")
    recompute_behaviour: bool = setting(False, help="Keep the previous version's trainable weights and compute the "
                                                    "learner's log-probs of tokens sampled at that version with them "
                                                    "(the mismatch metrics and corrections); without it such tokens "
                                                    "are measured against the current policy.")
    seed: int = setting(0, help="Seed of the initial model (when fresh) and of the training step.")
