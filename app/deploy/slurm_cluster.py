"""What ``forge deploy --target slurm`` asks the Slurm cluster it runs beside (a login node, where ``sinfo``
answers): how many nodes the job's partition has, so that a job asking for more is refused here instead of pending
for ever (Slurm accepts it and waits with ``Reason=PartitionConfig``). Where no cluster answers, nothing is
checked."""

from __future__ import annotations

import shutil
import subprocess

import click

from forge.app.deploy.config import DeployConfig

SINFO_TIMEOUT_S = 30


def partitions() -> tuple[dict[str, int], str | None] | None:
    """(node count of each partition, the default partition) of the cluster sinfo answers for; None where sinfo is
    missing or does not answer."""
    sinfo = shutil.which("sinfo")
    if sinfo is None:
        return None
    try:
        done = subprocess.run([sinfo, "--noheader", "--format=%P %D"], capture_output=True, text=True,
                              timeout=SINFO_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    counts: dict[str, int] = {}
    default = None
    for line in done.stdout.splitlines():
        name, _, count = line.partition(" ")
        if not count.strip().isdigit():
            continue
        if name.endswith("*"):
            name = default = name[:-1]
        counts[name] = counts.get(name, 0) + int(count)
    return counts, default


def check_fits(config: DeployConfig) -> str | None:
    """UsageError when the job's partition does not exist or has fewer nodes than the job asks for; a note where
    no cluster answered."""
    found = partitions()
    if found is None:
        where = f"partition {config.partition}" if config.partition else "the default partition"
        return f"note: no Slurm cluster answered sinfo here: not checked that {where} has {config.job_nodes} node(s)"
    counts, default = found
    name = config.partition or default
    if name not in counts:
        known = ", ".join(sorted(counts)) or "none"
        raise click.UsageError(f"the cluster has no partition {name or '(no default)'} (partitions: {known}): "
                               "give --partition")
    if config.job_nodes > counts[name]:
        raise click.UsageError(f"the job asks for {config.job_nodes} nodes and partition {name} has {counts[name]}: "
                               f"give --nodes {counts[name]} (the services then share nodes) or a larger --partition")
    return None
