"""Where a Slurm job's services run (``slurm_layout``): one node per role by default, roles sharing the job's nodes
when ``--nodes`` is smaller, each node's GPUs split between what it runs, and layouts that cannot be placed refused
by ``forge deploy`` before anything is written."""

from __future__ import annotations

from pathlib import Path

import pytest

from forge.app.deploy.config import DeployConfig
from forge.app.deploy.slurm_layout import Layout
from forge.settings import SettingsError, build

from helpers.deploy import deploy


def layout(**values) -> Layout:
    return Layout.of(build(DeployConfig, {"target": "slurm", "shared_dir": Path("/s"), **values}))


def test_one_node_per_role_by_default():
    found = layout(learner_nodes=2, actors=5, actors_per_node=2)
    assert found.nodes == 6
    assert found.learners == (1, 2)
    assert found.actors == (3, 3, 4, 4, 5)
    assert not found.shared
    assert found.describe(rollout=True, cache=True) == [
        "node 0: pool, cache, gateway(s), rollout driver(s)", "node 1: learner rank 0", "node 2: learner rank 1",
        "node 3: actors 0, 1", "node 4: actors 2, 3", "node 5: actor 4"]


def test_fewer_nodes_wrap_the_roles_around_the_job():
    found = layout(learner_nodes=2, actors=1, learner_gpus=0, actor_gpus=0, nodes=2)
    assert (found.learners, found.actors, found.shared) == ((1, 0), (1,), True)
    assert found.describe(rollout=False, cache=False) == ["node 0: pool, gateway(s); learner rank 1",
                                                          "node 1: learner rank 0; actor 0"]
    single = layout(learner_nodes=1, actors=3, actors_per_node=4, nodes=1)
    assert (single.learners, single.actors) == ((0,), (0, 0, 0))


def test_a_shared_node_splits_its_gpus_the_learners_first():
    found = layout(learner_nodes=1, learner_gpus=4, actors=4, actor_gpus=2, actors_per_node=2, nodes=2)
    # node 0: the services and actors 0-1; node 1: the learner (GPUs 0-3) and actors 2-3 (4-5, 6-7)
    assert found.actors == (0, 0, 1, 1)
    assert (found.node_gpus(0), found.node_gpus(1), found.gpus_per_node) == (4, 8, 8)
    assert found.learner_devices() == "0,1,2,3"
    assert [found.actor_devices(i) for i in range(4)] == ["0,1", "2,3", "4,5", "6,7"]
    alone = layout(learner_gpus=8, actors=1, actor_gpus=8)
    assert (alone.learner_devices(), alone.actor_devices(0)) == (None, None)     # every GPU of its node
    cpu = layout(learner_gpus=0, actors=1, actor_gpus=0)
    assert (cpu.learner_devices(), cpu.actor_devices(0), cpu.gpus_per_node) == ("", "", 0)


@pytest.mark.parametrize(("values", "message"), [
    ({"nodes": 5}, "places its services on 3 nodes"),
    ({"learner_nodes": 3, "nodes": 2}, "3 learner nodes need a job of as many nodes"),
    ({"actors": 4, "actors_per_node": 1, "nodes": 3}, "4 actors, 1 a node, need 4 nodes"),
])
def test_a_layout_that_cannot_be_placed_is_refused(values, message):
    with pytest.raises(SettingsError, match=message):
        build(DeployConfig, {"target": "slurm", "shared_dir": Path("/s"), **values})


def test_deploy_prints_the_placement_and_the_script_asks_for_its_nodes(tmp_path):
    result, out = deploy(tmp_path, "slurm", "--nodes", "2", "--learner-nodes", "2", "--learner-gpus", "0",
                         "--actor-gpus", "0")
    assert result.exit_code == 0, result.output
    assert "placement on the job's 2 node(s):" in result.output
    assert "node 1: learner rank 0; actor 0" in result.output
    text = (out / "forge.sbatch").read_text()
    assert "#SBATCH --nodes=2" in text and "#SBATCH --requeue" in text and "--gres" not in text
    (tmp_path / "bad").mkdir()
    bad, _ = deploy(tmp_path / "bad", "slurm", "--nodes", "1", "--learner-nodes", "2")
    assert bad.exit_code == 2 and "2 learner nodes need a job of as many nodes" in bad.output
