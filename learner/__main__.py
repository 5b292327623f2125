"""``python -m forge.learner``: the learner command (also what torchrun launches for --nproc > 1)."""

from forge.learner.cli import learner

learner.main(prog_name="forge-learner", auto_envvar_prefix="FORGE_LEARNER")
