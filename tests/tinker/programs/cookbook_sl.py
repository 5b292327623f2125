"""tinker-cookbook's supervised recipe, as its sl_basic.py shows swapping in a dataset of one's own: the conversations
file the cookbook ships, the role_colon renderer, LoRA on the given base model, a few steps against TINKER_BASE_URL
(run in the SDK's environment). Prints one JSON object: the metrics the cookbook logged and its checkpoints.

Usage: TINKER_BASE_URL=... TINKER_API_KEY=tml-... python cookbook_sl.py BASE_MODEL LOG_DIR STEPS"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from importlib import resources
from pathlib import Path

from tinker_cookbook.renderers import TrainOnWhat
from tinker_cookbook.supervised import train
from tinker_cookbook.supervised.data import FromConversationFileBuilder
from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig


def main(base_model: str, log_dir: str, steps: int) -> None:
    conversations = resources.files("tinker_cookbook") / "example_data" / "conversations.jsonl"
    common = ChatDatasetBuilderCommonConfig(model_name_for_tokenizer=base_model, renderer_name="role_colon",
                                            max_length=1024, batch_size=4,
                                            train_on_what=TrainOnWhat.ALL_ASSISTANT_MESSAGES)
    config = train.Config(log_path=log_dir, model_name=base_model, renderer_name="role_colon", recipe_name="forge_sl",
                          dataset_builder=FromConversationFileBuilder(common_config=common,
                                                                      file_path=str(conversations)),
                          learning_rate=5e-3, lr_schedule="linear", num_epochs=1, lora_rank=8,
                          base_url=os.environ["TINKER_BASE_URL"], eval_every=0, save_every=2, max_steps=steps)
    asyncio.run(train.main(config))
    metrics = [json.loads(line) for line in (Path(log_dir) / "metrics.jsonl").read_text().splitlines()]
    checkpoints = (Path(log_dir) / "checkpoints.jsonl")
    print(json.dumps({"metrics": metrics,
                      "checkpoints": [json.loads(line) for line in checkpoints.read_text().splitlines()]
                      if checkpoints.exists() else []}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
