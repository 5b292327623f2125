"""The process environment's variables Forge reads besides its settings' own (``FORGE_<COMMAND>_<OPTION>``, which
each setting declares), each declared once here with what it does. (Named for the variables: an environment in Forge
is an RL environment, a run file's ``[env]``.) Code reads them through ``read``, which refuses an
undeclared name; ``tests/unit/core/test_layers.py`` checks that nothing reads the environment any other way, and
docs/config.md lists them."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Variable:
    name: str
    help: str
    default: str | None = None          # what an unset variable reads as


VARIABLES: dict[str, Variable] = {v.name: v for v in (
    Variable("FORGE_CPU_KERNELS", "0 turns the torch engine's compiled CPU attention kernel off in every process, "
                                  "whatever --cpu-kernels says (for debugging a kernel).", "1"),
    Variable("FORGE_KERNEL_DIR", "Where the compiled CPU kernels are kept [default: $XDG_CACHE_HOME/forge/kernels]."),
    Variable("XDG_CACHE_HOME", "The user's cache directory, where the compiled CPU kernels go [default: ~/.cache]."),
    Variable("CC", "The C compiler that builds the CPU kernels on first use.", "cc"),
    Variable("FORGE_POD_NAME", "Kubernetes: the pod's own name, set by forge deploy's manifests (downward API); its "
                               "ordinal is a learner pod's node rank."),
    Variable("HOSTNAME", "The pod's name where FORGE_POD_NAME is not set (the learner's health probe).", ""),
    Variable("RANK", "Set by torchrun: the learner process's global rank (rank 0 reads the pool, publishes weights "
                     "and serves Stats)."),
    Variable("WORLD_SIZE", "Set by torchrun: the learner job's processes, which --context-parallel must divide; "
                           "unset, the learner starts torchrun itself when --nproc or --nnodes asks for more than "
                           "one.", "1"),
    Variable("LOCAL_RANK", "Set by torchrun: the learner process's rank on its node (its GPU).", "0"),
    Variable("PATH", "Where a black-box agent's program is looked up.", os.defpath),
    Variable("PYTHONPATH", "Where Python looks for modules: a verifiers environment given as a file has its folder "
                           "put first, for the processes verifiers starts (its toolsets import by module name).", ""),
    Variable("VLLM_CPU_OMP_THREADS_BIND", "vLLM's binding of its CPU workers to cores: Forge's vLLM actors set it to "
                                          "nobind (they float as torch's threads do) unless it is set."),
)}


def read(name: str) -> str | None:
    """The value of the declared variable ``name`` (its declared default when unset); KeyError for a name not
    declared here."""
    try:
        variable = VARIABLES[name]
    except KeyError:
        raise KeyError(f"{name} is not declared in forge.variables") from None
    return os.environ.get(name, variable.default)


def is_set(name: str) -> bool:
    """Whether the declared variable ``name`` is set (to anything)."""
    if name not in VARIABLES:
        raise KeyError(f"{name} is not declared in forge.variables")
    return name in os.environ
