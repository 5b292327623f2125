"""``forge dash`` as a real process on a loopback port: its JSON endpoints, its headers, bad input answered 4xx
(never 5xx), and its key when it has one."""

from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from forge.app.dash.cli import dash
from forge.app.dash.data import Curves

from helpers.browse_pool import MARKUP
from helpers.dash import dash_client, make_run, start_dash

KEY = "dash-test-key-8c1f"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("dash") / "run"
    roles = make_run(run_dir)
    return run_dir, roles


@pytest.fixture(scope="module")
def client(run, tmp_path_factory):
    with dash_client(run[0], tmp_path_factory.mktemp("dash-out")) as http:
        yield http


def test_page_assets_and_strict_headers(client):
    page = client.get("/")
    assert page.status_code == 200 and "/static/dash.js" in page.text
    csp = page.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "script-src 'self'" in csp and "unsafe-inline" not in csp
    assert page.headers["x-content-type-options"] == "nosniff"
    for asset in ("dash.js", "dash.css", "favicon.svg", "login.html"):
        assert client.get(f"/static/{asset}").status_code == 200
    missing = client.get("/api/nothing")
    assert missing.status_code == 404 and "content-security-policy" in missing.headers


def test_run_curves_and_health(client, run):
    info = client.get("/api/run").json()
    assert info["run_dir"] == str(run[0]) and info["pools"] == ["pool"]
    assert info["summary"] == {"domains": ["math", "web"], "eval_end": {"math": 0.75}}     # no settings
    curves = client.get("/api/curves").json()
    assert curves["steps"][:3] == [1.0, 2.0, 3.0] and len(curves["steps"]) == 30
    assert {"reward_mean", "reward/math", "reward/web", "loss", "tokens_per_s", "staleness_mean",
            "tree_compression"} <= set(curves["curves"])
    assert client.get("/api/health").json()["services"] == []      # the run has no services.json


def test_sessions_filters_and_transcript(client, run):
    roles = run[1]
    page = client.get("/api/sessions", params={"domain": "math", "min_reward": "0.5"}).json()
    assert [s["session_id"] for s in page["sessions"]] == ["math-0", "math-2"] and page["total"] == 2
    second = client.get("/api/sessions", params={"page": 2, "page_size": 4}).json()
    assert len(second["sessions"]) == 2 and not second["has_more"]
    shown = client.get(f"/api/sessions/{roles['markup']}").json()
    call = shown["calls"][0]
    assert call["completion_text"] == MARKUP and "".join(call["pieces"]) == MARKUP
    assert len(call["logprobs"]) == len(call["pieces"]) and call["advantage"] == pytest.approx(0.25)
    multi = client.get(f"/api/sessions/{roles['multi']}").json()
    assert [c["advantage"] for c in multi["calls"]] == [pytest.approx(0.5)] * 2
    assert client.get(f"/api/sessions/{roles['rewrite']}").json()["calls"][1]["rewrite"]["dropped"] > 0


def test_group_tree(client, run):
    tree = client.get(f"/api/sessions/{run[1]['multi']}/tree").json()
    assert len(tree["samples"]) == 5 and tree["tree_tokens"] < tree["sample_tokens"]
    assert tree["segments"][0]["times"] == 5 and tree["segments"][0]["parent"] is None
    assert tree["compression"] == pytest.approx(tree["sample_tokens"] / tree["tree_tokens"])


@pytest.mark.parametrize(("path", "status"), [
    ("/api/sessions/nope", 404), ("/api/sessions/nope/tree", 404), ("/api/sessions/" + "x" * 2000, 404),
    ("/api/sessions/a%00b", 404), ("/api/sessions?page=1000000", 404), ("/api/sessions?page=10000000000", 400),
    ("/api/sessions?page=-1", 400), ("/api/sessions?page=abc", 400), ("/api/sessions?page_size=100000", 400),
    ("/api/sessions?min_reward=nan", 400), ("/api/sessions?min_reward=inf", 400),
    ("/api/sessions?min_reward=2&max_reward=1", 400), ("/api/sessions?min_version=1e3", 400),
    ("/api/sessions?status=done", 400), ("/api/sessions?domain=" + "d" * 300, 400), ("/api/sessions?x=1", 400),
    ("/api/sessions?page=1&page=2", 400), ("/api/sessions?pool=../pool", 404), ("/api/sessions?pool=eval-pool", 404),
    ("/api/sessions/web-0?pool=nope", 404), ("/api/curves?since=3", 400), ("/static/../cli.py", 404),
    ("/static/", 403), ("/api/sessions/web-0/tree/more", 404), ("/api/sessions/web-0/ratios", 404),
    ("/api/sessions/web-0/ratios?step=x", 400), ("/api/checkpoints?pool=nope", 404),
])
def test_bad_input_is_a_client_error(client, path, status):
    answer = client.get(path)
    assert answer.status_code == status, answer.text
    assert answer.json()["error"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(params=st.dictionaries(st.sampled_from(["page", "page_size", "domain", "status", "min_reward", "max_reward",
                                               "min_version", "max_version", "pool", "other"]),
                              st.text(max_size=30), max_size=5),
       session_id=st.text(min_size=1, max_size=40))
def test_no_input_makes_a_server_error(client, params, session_id):
    assert client.get("/api/sessions", params=params).status_code < 500
    assert client.get("/api/sessions/" + quote(session_id, safe="")).status_code < 500


def test_other_host_names_are_refused_on_loopback(client):
    assert client.get("/api/run", headers={"Host": "attacker.example"}).status_code == 403


def test_with_a_key_everything_but_the_sign_in_needs_it(run, tmp_path):
    key_file = tmp_path / "dash.key"
    key_file.write_text(KEY + "\n")
    service = start_dash(run[0], tmp_path, "--api-key-file", str(key_file))
    try:
        with httpx.Client(base_url=service.info["url"], timeout=60) as http:
            assert http.get("/api/run").status_code == 401
            assert http.get("/api/sessions", headers={"Authorization": "Bearer wrong"}).status_code == 401
            assert http.get("/api/run", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
            assert http.get("/api/run", headers={"X-Api-Key": KEY}).status_code == 200
            assert http.get("/").headers["location"] == "/login"
            assert http.get("/login").status_code == 200
            assert http.post("/login", data={"key": "wrong"}).headers["location"] == "/login?failed=1"
            signed = http.post("/login", data={"key": KEY})
            assert signed.headers["location"] == "/" and KEY not in signed.headers["set-cookie"]
            assert re.search(r"(?i)httponly", signed.headers["set-cookie"])
            assert http.get("/api/run").status_code == 200          # the client kept the cookie
    finally:
        service.stop()
    assert KEY not in service.log_text()


@pytest.mark.parametrize(("args", "message"), [
    (["--host", "0.0.0.0"], "needs --api-key"),
    (["--host", "10.1.2.3"], "needs --api-key"),
    (["--api-key", " "], "empty value is not allowed"),
    (["--api-key-file", "{empty}"], "holds no key"),
    (["--port", "70000"], "70000"),
])
def test_settings_refuse_an_open_or_empty_key(run, tmp_path, args, message):
    empty = tmp_path / "empty.key"
    empty.write_text("\n# nothing\n")
    result = CliRunner().invoke(dash, [str(run[0]), *[a.format(empty=empty) for a in args]])
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_curves_read_what_was_appended(tmp_path):
    path = tmp_path / "metrics.jsonl"
    curves = Curves(path)
    assert curves.series() == {"steps": [], "curves": {}}
    path.write_text(json.dumps({"step": 1, "loss": 2.0}) + "\n" + '{"step": 2, "lo')
    assert curves.series()["steps"] == [1.0]
    with path.open("a") as handle:
        handle.write('ss": 1.0}\nnot json\n' + json.dumps({"step": 1, "loss": 3.0, "reward/qa": 0.5}) + "\n")
    assert curves.series() == {"steps": [1.0, 2.0], "curves": {"loss": [3.0, 1.0], "reward/qa": [0.5, None]}}
    path.write_text(json.dumps({"step": 5, "loss": float("nan"), "tokens_per_s": 9}) + "\n")    # a new run
    assert curves.series() == {"steps": [5.0], "curves": {"tokens_per_s": [9.0]}}


def test_pools_are_found_in_runs_of_a_multi_run(tmp_path):
    from forge.app.dash.data import find_pools

    for name in ("pool", "a/pool", "a/eval-pool", "b/notes"):
        (tmp_path / name).mkdir(parents=True)
        (tmp_path / name / "data.mdb").write_bytes(b"")
    assert list(find_pools(Path(tmp_path))) == ["pool", "a/pool", "a/eval-pool"]


def test_a_group_too_large_to_merge_is_refused(run, monkeypatch):
    from forge.app.dash import views
    from forge.pool import InvalidRequestError, PoolReader
    from forge.pool.browse import group_sessions

    monkeypatch.setattr(views, "MAX_TREE_TOKENS", 100)
    with PoolReader(run[0] / "pool") as reader, pytest.raises(InvalidRequestError, match="more than the dash"):
        views.prefix_tree(group_sessions(reader, run[1]["multi"]))
