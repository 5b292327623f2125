"""``forge deploy --config run.toml --target k8s|slurm``: the command. It reads the run file (its ``[deploy]`` table
holds the settings, the other tables go to the services), checks everything, renders the target's files in memory
and only then writes them: a refused input writes nothing."""

from __future__ import annotations

import os
import re
from pathlib import Path

import click

from forge.app.deploy.config import DeployConfig, OutFile
from forge.app.deploy.runfile import RunFile, RunFileError
from forge.cli.options import RUN_FILE, settings_command

CONFIGMAP_LIMIT = 1 << 20                      # Kubernetes keeps an object below 1 MiB
MANIFEST_NAME = re.compile(r"\d\d-[a-z-]+\.yaml")


def check_learner_job(config: DeployConfig, run: RunFile) -> None:
    """RunFileError for a ``[learner] context_parallel`` that does not divide the learner job's processes (its nodes
    times each node's processes): every rank of the job would refuse it at start."""
    context = run.options("learner").get("context_parallel", 1)
    processes = config.learner_nodes * config.learner_processes
    if processes % context:
        raise RunFileError(f"{run.path}: [learner] context_parallel = {context} must divide the learner job's "
                           f"{processes} processes ({config.learner_nodes} learner_nodes x "
                           f"{config.learner_processes} per node, one per learner_gpus)")


def render(config: DeployConfig, run: RunFile) -> list[OutFile]:
    """The target's files for ``run``; RunFileError for a run file the target cannot take."""
    check_learner_job(config, run)
    if config.target == "k8s":
        from forge.app.deploy import k8s

        if len(run.text.encode()) > CONFIGMAP_LIMIT - 4096:
            raise RunFileError(f"{run.path} is {len(run.text.encode())} bytes: a ConfigMap holds less than 1 MiB")
        return k8s.render(config, run)
    from forge.app.deploy import slurm

    return slurm.render(config, run)


def write(out: Path, files: list[OutFile], target: str) -> None:
    """Write ``files`` into ``out`` (made if missing); a file holding keys is made readable by its owner alone
    before any key is written into it. Manifests an earlier deploy wrote there and this one does not are removed,
    so that ``kubectl apply -f OUT/`` applies this deployment and no other."""
    if out.exists() and not out.is_dir():
        raise click.BadParameter(f"{out} is a file, not a directory", param_hint="'--out'")
    try:
        out.mkdir(parents=True, exist_ok=True)
        if target == "k8s":
            names = {f.name for f in files}
            for stale in out.iterdir():
                if MANIFEST_NAME.fullmatch(stale.name) and stale.name not in names and stale.is_file():
                    stale.unlink()
        for file in files:
            path = out / file.name
            if file.secret:
                descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                os.fchmod(descriptor, 0o600)          # a file left by an earlier deploy keeps its mode otherwise
                with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
                    handle.write(file.text)
            else:
                temporary = path.with_name(f".{path.name}.tmp")
                temporary.write_text(file.text, encoding="utf-8")
                os.replace(temporary, path)
    except OSError as exc:
        raise click.ClickException(f"cannot write to {out}: {exc}") from exc


def summary(config: DeployConfig, run: RunFile, files: list[OutFile]) -> list[str]:
    c = config
    cache = c.cache and run.cache_serves_actors
    shape = (f"pool, {'cache, ' if cache else ''}learner ({c.learner_nodes} node(s) x {c.learner_processes} "
             f"process(es)), {c.actors} actor(s) ({c.actor_gpus} GPU(s) each"
             + (f", relay fan-out {c.relay_fanout}" if c.relay_fanout else "") + f"), {c.gateways} gateway(s)"
             + (f", {c.gateways} rollout driver(s)" if run.rollout else ""))
    if c.cache and not cache:
        shape += f" (no cache: the [actor] backend is {run.backend})"
    if c.target == "k8s":
        secret = next(f for f in files if f.secret)
        lines = [f"wrote {len(files)} manifests to {c.out}: {', '.join(f.name for f in files)}",
                 f"namespace {c.namespace}: {shape}",
                 f"the run's API keys are in {c.out / secret.name}, readable by you alone (mode 0600): keep it "
                 "private, out of version control",
                 f"apply with: kubectl apply -f {c.out}/"]
        if run.rollout:
            team = c.team_dir or f"/forge/{c.name}/team"
            lines.insert(2, f"the rollout drivers read the team's files from {team} (relative paths of the run file "
                            "resolve there)")
        return lines
    from forge.app.deploy.slurm_layout import Layout

    script = c.out / files[0].name
    placement = Layout.of(c).describe(run.rollout, cache)
    return [f"wrote {script}: {shape}",
            f"placement on the job's {len(placement)} node(s):", *(f"  {line}" for line in placement),
            f"the job makes the run's API keys afresh in {c.shared_dir}/{c.name}/keys (mode 0600)",
            f"submit with: sbatch {script}"]


@settings_command("deploy", DeployConfig)
def deploy(config: DeployConfig) -> None:
    """Write what a cluster needs to run the system of a run file: Kubernetes manifests (--target k8s, applied with
    kubectl apply -f OUT/) or a Slurm batch script (--target slurm, submitted with sbatch). The run file's [deploy]
    table holds these settings; its other tables ([learner], [actor], [gateway], [cache], [pool], [model], [tasks],
    [agent], [rollout]) go to the services as they are, which read them with --config. Everything is checked
    before anything is written. See docs/deploy.md."""
    run_file = click.get_current_context().meta.get(RUN_FILE)
    if not run_file:
        raise click.UsageError("give --config RUN_FILE: the run file whose services are deployed (see docs/deploy.md)")
    run = RunFile.read(run_file)
    note = None
    if config.target == "slurm":
        from forge.app.deploy.slurm_cluster import check_fits

        note = check_fits(config)
    files = render(config, run)
    write(config.out, files, config.target or "")
    for line in summary(config, run, files):
        click.echo(line)
    if note:
        click.echo(note, err=True)
    if config.target == "slurm" and config.shared_dir is not None and \
            not run.path.is_relative_to(config.shared_dir):
        click.echo(f"note: the job reads the run file at {run.path} (and the team's files beside it): keep them "
                   "on a file system every node of the job sees", err=True)
