"""The Tinker API served by Forge: a team's own training loop, written against Thinking Machines' ``tinker`` SDK,
drives Forge's learner code (LoRA on any family, the SDK's losses, exact prefix-tree packing) and samples from Forge's
actors. ``forge-tinker`` (``cli``) composes the HTTP server (``server``) over ``types.Training`` and
``types.Sampling``."""
