"""``forge up``: the whole system on one machine — learner, actors, gateway (and forge-cache) as separate processes on
loopback, the rollout driver in this process — on the built-in tasks or a team's own, with a live summary, held-out
evaluation at the start and the end, and a run directory holding metrics, checkpoints, logs and reward curves.

``config``: its settings, the main job's tuning of the services; ``plan``: every service instance's typed
settings; ``system``: their processes; ``live``: the live view; ``run``: the run itself; ``cli``: the command.
"""
