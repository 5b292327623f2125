"""The code example's verifier: the share of the task's tests that pass in the session's sandbox, where the agent
left its fix. The task's own tests are put back first, so an agent that edits the tests gains nothing."""

from pathlib import Path

from forge.rollout.sandbox.verify import tests_pass_rate

HERE = Path(__file__).parent


def score(task, reply, session):
    return {"tests": tests_pass_rate(session, restore=HERE / task["workspace"])}
