"""The settings of one ``forge up`` run as plain JSON: forge up's own and every service instance's, resolved, for
summary.json and the experiment trackers alike."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from forge.app.up.config import UpConfig
from forge.tracking import settings_json


def run_settings(config: UpConfig, instances: Mapping[str, Any]) -> dict[str, Any]:
    """forge up's settings and every service instance's (``forge.app.up.plan.Instance`` by name), as plain JSON."""
    return {"up": settings_json(config),
            "services": {name: settings_json(instance.settings) for name, instance in instances.items()}}
