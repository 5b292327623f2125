"""Where a Slurm job's services run: which of the job's nodes takes the pool service and the gateways, each learner
rank, each actor, and which of a node's GPUs each gets.

With one node per role (the default) node 0 takes the services that need no GPU (pool, cache, gateways, rollout
drivers), the next nodes one learner rank each, the rest the actors, ``actors_per_node`` to a node. With fewer nodes
(``--nodes``) the roles wrap around the job's nodes in that order and share them: every learner rank still has a
node of its own among the learner ranks (they are one torchrun job, one node rank each), every group of
``actors_per_node`` actors a node of its own among the actors (their ports are per node), and a node's GPUs are
split between what it runs, the learner's first."""

from __future__ import annotations

from dataclasses import dataclass

from forge.app.deploy.config import DeployConfig

SERVICES_NODE = 0


@dataclass(frozen=True)
class Layout:
    nodes: int                          # the job's nodes
    learners: tuple[int, ...]           # node of each learner rank
    actors: tuple[int, ...]             # node of each actor
    actors_per_node: int
    learner_gpus: int
    actor_gpus: int
    teachers: tuple[int, ...] = ()      # node of each of the teacher's actors (on-policy distillation)

    @classmethod
    def of(cls, config: DeployConfig, teachers: int = 0) -> Layout:
        """The layout of ``config``'s services, and of ``teachers`` actors serving a teacher, on its job's nodes
        (``DeployConfig.check`` refused what cannot be placed): teacher k beside actor k (modulo the actors), after
        the actors of its node."""
        c = config
        nodes = c.job_nodes
        learners = tuple((1 + rank) % nodes for rank in range(c.learner_nodes))
        actors = tuple((1 + c.learner_nodes + i // c.actors_per_node) % nodes for i in range(c.actors))
        return cls(nodes, learners, actors, c.actors_per_node, c.learner_gpus, c.actor_gpus,
                   tuple(actors[k % len(actors)] for k in range(teachers)))

    @property
    def shared(self) -> bool:
        """Whether some node runs more than one role."""
        return self.nodes < 1 + len(self.learners) + len(set(self.actors))

    def actor_slot(self, index: int) -> int:
        """The actor's place among the actors of its node (its ports are offset by it)."""
        return index % self.actors_per_node

    def teacher_slot(self, index: int) -> int:
        """The teacher actor's place on its node, after the node's actors' places (its ports are offset by it)."""
        node = self.teachers[index]
        return self.actors_per_node + sum(1 for n in self.teachers[:index] if n == node)

    def learner_on(self, node: int) -> bool:
        return node in self.learners

    def node_gpus(self, node: int) -> int:
        """GPUs the node's services take."""
        learner = self.learner_gpus if self.learner_on(node) else 0
        return learner + self.actor_gpus * sum(1 for n in (*self.actors, *self.teachers) if n == node)

    @property
    def gpus_per_node(self) -> int:
        """GPUs each node of the job asks for (Slurm's nodes of one job ask alike): the most any node takes."""
        return max(self.node_gpus(n) for n in range(self.nodes))

    def learner_devices(self) -> str | None:
        """CUDA_VISIBLE_DEVICES of a learner rank: "" on CPU, None where it takes every GPU its node is given."""
        if self.learner_gpus == 0:
            return ""
        if self.learner_gpus == self.gpus_per_node:
            return None
        return _devices(0, self.learner_gpus)

    def actor_devices(self, index: int) -> str | None:
        """CUDA_VISIBLE_DEVICES of an actor: "" on CPU, None where it takes every GPU its node is given."""
        if self.actor_gpus == 0:
            return ""
        if self.actor_gpus == self.gpus_per_node:
            return None
        node = self.actors[index]
        first = (self.learner_gpus if self.learner_on(node) else 0) + self.actor_slot(index) * self.actor_gpus
        return _devices(first, self.actor_gpus)

    def teacher_devices(self, index: int) -> str | None:
        """CUDA_VISIBLE_DEVICES of a teacher's actor: after its node's learner's and actors' GPUs."""
        if self.actor_gpus == 0:
            return ""
        node = self.teachers[index]
        actors = sum(1 for n in self.actors if n == node)
        before = sum(1 for n in self.teachers[:index] if n == node)
        first = (self.learner_gpus if self.learner_on(node) else 0) + (actors + before) * self.actor_gpus
        return _devices(first, self.actor_gpus)

    def roles(self, node: int, rollout: bool, cache: bool) -> list[str]:
        """What runs on ``node``, in words."""
        found = []
        if node == SERVICES_NODE:
            found.append("pool" + (", cache" if cache else "") + ", gateway(s)" + (", rollout driver(s)" if rollout
                                                                                    else ""))
        found += [f"learner rank {r}" for r, n in enumerate(self.learners) if n == node]
        actors = [str(i) for i, n in enumerate(self.actors) if n == node]
        if actors:
            found.append(f"actor{'s' if len(actors) > 1 else ''} {', '.join(actors)}")
        teachers = [str(k) for k, n in enumerate(self.teachers) if n == node]
        if teachers:
            found.append(f"teacher actor{'s' if len(teachers) > 1 else ''} {', '.join(teachers)}")
        return found

    def describe(self, rollout: bool, cache: bool) -> list[str]:
        """One line per node: its index in the job and what runs there."""
        return [f"node {n}: {'; '.join(self.roles(n, rollout, cache))}" for n in range(self.nodes)]


def _devices(first: int, count: int) -> str:
    return ",".join(str(d) for d in range(first, first + count))

