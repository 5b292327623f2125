"""``python -m forge.learner.tinker``: the forge-tinker command (also what torchrun launches for --nproc > 1)."""

from forge.learner.tinker.cli import tinker

tinker.main(prog_name="forge-tinker", auto_envvar_prefix="FORGE_TINKER")
