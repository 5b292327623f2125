"""The settings of a forge up run as plain JSON — forge up's own and every service instance's, resolved — which
summary.json and the experiment trackers hold: nested objects of numbers, strings and lists, no Python reprs."""

from __future__ import annotations

import json

from forge.app.up.config import UpConfig
from forge.app.up.plan import Plan
from forge.app.up.run_settings import run_settings


def test_the_run_settings_are_plain_json(tmp_path):
    config = UpConfig(run_dir=tmp_path / "run").with_services(learner={"lr": 3e-4})
    settings = run_settings(config, {i.name: i for i in Plan(config).check()})
    text = json.dumps(settings)
    assert json.loads(text) == settings and "<class" not in text and "Overrides" not in text
    assert settings["up"]["run_dir"] == str(tmp_path / "run") and settings["up"]["driver"]["groups_in_flight"] == 6
    assert settings["services"]["learner"]["trainer"]["lr"] == 3e-4
    assert settings["services"]["learner"]["pool_path"] == str(tmp_path / "run" / "pool")
    assert {"learner", "actor-0", "gateway"} <= set(settings["services"])
