"""Rollouts: the driver that plays task groups through a gateway (``driver``), its workloads (the built-in tasks, or
a team's tasks with its verifier and its agent program or ``forge.agents.Agent`` class: ``workload``, ``team``,
``verifier``, ``blackbox``, ``agent``), how an agent's calls reach the model (``llm``), held-out evaluation
(``evaluate``), and ``forge rollout`` (``cli``, settings in ``config``). See docs/agents.md."""
