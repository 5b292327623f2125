"""``forge deploy``: from one run file, what a cluster needs to run Forge's services — Kubernetes manifests or a
Slurm batch script. Forge describes its services; Kubernetes or Slurm places and restarts them.

Modules: ``config`` (the ``[deploy]`` settings and the fixed ports and paths), ``runfile`` (reading and checking the
run file), ``services`` (each service's command line: the one place where deploy settings become service options),
``k8s`` (the manifests), ``slurm`` (the batch script), ``probe`` (the multi-node learner's health probe), ``cli``
(the command).
"""
