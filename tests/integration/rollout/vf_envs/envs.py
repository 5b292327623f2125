"""The test environments as a run file names them: functions returning a verifiers Env."""

import verifiers.v1 as vf


def single_turn(num_examples: int = 6, explode_first: bool = False) -> vf.Env:
    return vf.SingleAgentEnv(vf.SingleAgentEnvConfig(
        taskset={"id": "vftest_qa", "num_examples": num_examples, "explode_first": explode_first},
        agent={"harness": {"id": "null"}, "max_turns": 1}))


def with_tools() -> vf.Env:
    return vf.SingleAgentEnv(vf.SingleAgentEnvConfig(
        taskset={"id": "vftest_tool"}, agent={"harness": {"id": "null"}, "max_turns": 3}))


def broken() -> vf.Env:
    raise RuntimeError("the dataset is missing")


def hosted() -> vf.Env:
    return vf.SingleAgentEnv(vf.SingleAgentEnvConfig(
        taskset={"id": "vftest_qa"}, agent={"harness": {"id": "null"}, "runtime": {"type": "docker"}}))


def with_shared_tools() -> vf.Env:
    return vf.SingleAgentEnv(vf.SingleAgentEnvConfig(
        taskset={"id": "vftest_shared"}, agent={"harness": {"id": "null"}, "max_turns": 3}))
