"""``forge dash``'s importance ratios on real recorded calls: a multi-run's lane whose pool was sampled by the
embedded engine from the weights of its learner's step-1 checkpoint, and whose step-2 checkpoint holds other
weights. The ratio of the checkpoint that sampled is 1, that of the other is exp(learner − recorded) as the
learner's own recomputation gives it, and bad input is answered 4xx."""

from __future__ import annotations

import math

import pytest

from forge.checkpoints import write_tiny_checkpoint
from forge.model import CausalLM
from forge.pool import InvalidRequestError, Pool, PoolReader

from helpers.browse_pool import record_many
from helpers.dash import dash_client
from helpers.learner_runs import engine_of
from helpers.recompute import learner_and_recorded
from helpers.rollouts import fill_pool


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("ratios") / "run"
    checkpoints = run_dir / "a" / "learner" / "checkpoints"
    sampler = write_tiny_checkpoint(checkpoints / "step-00000001" / "model", seed=0)
    write_tiny_checkpoint(checkpoints / "step-00000002" / "model", seed=1)
    (checkpoints / "latest").write_text("step-00000002")
    (checkpoints / ".staging-00000003" / "model").mkdir(parents=True)       # being written: not a checkpoint
    model = CausalLM.from_pretrained(sampler)
    engine = engine_of(model)
    try:
        with Pool(run_dir / "a" / "pool", sync=False) as pool:
            sessions = fill_pool(pool, engine, groups=2, group_size=2, calls=2, max_tokens=8,
                                 vocab=model.config.vocab_size)
    finally:
        engine.close()
    record_many(run_dir / "b" / "pool", 4)           # a lane without a learner
    with PoolReader(run_dir / "a" / "pool") as reader:
        calls = {sid: sorted(reader.get_session(sid).calls, key=lambda c: c.index) for sid in sessions}
    return run_dir, calls


@pytest.fixture(scope="module")
def client(run, tmp_path_factory):
    with dash_client(run[0], tmp_path_factory.mktemp("dash-out"), timeout_s=120) as http:
        yield http


def ratios(client, session_id: str, **params) -> dict:
    answer = client.get(f"/api/sessions/{session_id}/ratios", params={"pool": "a/pool", **params})
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_checkpoints_are_listed_by_lane(client):
    assert client.get("/api/checkpoints", params={"pool": "a/pool"}).json() == {"steps": [1, 2], "latest": 2}
    assert client.get("/api/checkpoints", params={"pool": "b/pool"}).json() == {"steps": [], "latest": None}


def test_the_checkpoint_that_sampled_gives_ratio_one(client, run):
    for session_id, calls in run[1].items():
        shown = ratios(client, session_id, step=1)
        assert shown["step"] == 1 and [c["index"] for c in shown["calls"]] == [0, 1]
        for call, got in zip(calls, shown["calls"], strict=True):
            assert len(got["ratio"]) == len(call.completion_ids) > 0
            assert got["ratio"] == pytest.approx([1.0] * len(call.completion_ids), abs=1e-3)
            assert got["logprob"] == pytest.approx(list(call.logprobs), abs=1e-3)


def test_another_checkpoint_gives_the_learners_ratio(client, run):
    other = run[0] / "a" / "learner" / "checkpoints" / "step-00000002" / "model"
    far = 0
    for session_id, calls in run[1].items():
        shown = ratios(client, session_id)                  # the latest: step 2
        assert shown["step"] == 2
        learner, recorded = learner_and_recorded(other, calls)
        expected = (learner - recorded).exp().tolist()
        got = [r for c in shown["calls"] for r in c["ratio"]]
        assert got == pytest.approx(expected, rel=1e-4)
        assert [lp for c in shown["calls"] for lp in c["logprob"]] == pytest.approx(learner.tolist(), abs=1e-4)
        far += sum(abs(math.log(r)) > 0.1 for r in got)
    assert far > 10                 # other weights: the ratios are not all near 1


@pytest.mark.parametrize(("path", "status", "message"), [
    ("/api/sessions/{sid}/ratios?pool=a/pool&step=abc", 400, "integer"),
    ("/api/sessions/{sid}/ratios?pool=a/pool&step=-1", 400, "step must be"),
    ("/api/sessions/{sid}/ratios?pool=a/pool&step=99999999999999999999", 400, "step must be"),
    ("/api/sessions/{sid}/ratios?pool=a/pool&step=1&step=2", 400, "more than once"),
    ("/api/sessions/{sid}/ratios?pool=a/pool&top=1", 400, "unknown parameter"),
    ("/api/sessions/{sid}/ratios?pool=a/pool&step=3", 404, "no learner checkpoint of step 3"),
    ("/api/sessions/nope/ratios?pool=a/pool", 404, "unknown session"),
    ("/api/sessions/{sid}/ratios?pool=nope", 404, "no pool"),
    ("/api/sessions/{sid}/ratios?pool=b/pool", 404, "no learner checkpoint in this run"),
    ("/api/sessions/{sid}/ratios", 404, "no pool"),               # the run has no RUN_DIR/pool
    ("/api/checkpoints?pool=a/pool&step=1", 400, "unknown parameter"),
])
def test_bad_input_is_a_client_error(client, run, path, status, message):
    answer = client.get(path.format(sid=next(iter(run[1]))))
    assert answer.status_code == status, answer.text
    assert message in answer.json()["error"]


def test_a_session_too_long_to_recompute_is_refused(run):
    from forge.app.dash.ratios import session_calls

    with PoolReader(run[0] / "a" / "pool") as reader:
        found = reader.get_session(next(iter(run[1])))
    assert len(session_calls(found)) == 2
    with pytest.raises(InvalidRequestError, match="more than the dash recomputes"):
        session_calls(found, limit=10)
