"""mini-swe-agent's default agent and configuration (bash through litellm tool calls), two steps in a scratch
folder."""

import os
import sys
import tempfile

import yaml
from minisweagent.agents.default import DefaultAgent
from minisweagent.config import builtin_config_dir
from minisweagent.environments.local import LocalEnvironment
from minisweagent.models.litellm_model import LitellmModel

config = yaml.safe_load((builtin_config_dir / "default.yaml").read_text())
model = LitellmModel(model_name="openai/gpt-4o-mini", cost_tracking="ignore_errors",
                     model_kwargs={"api_base": os.environ["OPENAI_BASE_URL"], "api_key": os.environ["OPENAI_API_KEY"],
                                   "max_tokens": 48})
with tempfile.TemporaryDirectory() as scratch:
    agent = DefaultAgent(model, LocalEnvironment(cwd=scratch), **{**config["agent"], "step_limit": 2})
    print(agent.run(sys.stdin.read()))
