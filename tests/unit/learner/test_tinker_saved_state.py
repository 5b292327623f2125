"""What the Tinker server saved survives its being killed at any moment: a checkpoint moved aside to be replaced
goes back to its place when its replacement never got there, and unfinished copies are cleared away; and sampler
weights deleted or written again stop being served, once no sample is using them, so that the next sample reads the
path again."""

from __future__ import annotations

import asyncio
from pathlib import Path

import torch

from forge.learner.tinker.checkpoints import STAGING_PREFIX, CheckpointStore
from forge.learner.tinker.sampling import ActorSampling
from forge.learner.tinker.types import LoraSpec
from forge.model.adapter_bundle import decode_bundle
from forge.model.lora_weights import SCALING


def fill_with(text: str):
    def fill(directory: Path) -> None:
        (directory / "weights.txt").write_text(text)
    return fill


def test_a_checkpoint_moved_aside_for_a_replacement_that_never_came_is_put_back(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    store.register("m1", "owner", "tiny", LoraSpec(rank=2))
    store.save("m1", "weights", "kept", fill_with("v1"))
    store.save("m1", "weights", "old-x", fill_with("v1"))
    store.save("m1", "sampler_weights", "replaced", fill_with("v1"))
    folder = tmp_path / "models" / "m1" / "weights"
    # Killed between moving "kept" aside and renaming its replacement into place; a save of "old-y" unfinished.
    (folder / "kept").rename(folder / f"{STAGING_PREFIX}old-kept-0123abcd")
    (folder / f"{STAGING_PREFIX}new-kept-89abcdef").mkdir()
    (folder / f"{STAGING_PREFIX}new-old-y-89abcdef").mkdir()
    # Killed after the replacement was in place, before the old copy was removed; and mid-delete.
    samplers = tmp_path / "models" / "m1" / "sampler_weights"
    (samplers / f"{STAGING_PREFIX}old-replaced-0123abcd").mkdir()
    (samplers / f"{STAGING_PREFIX}deleted-gone-0123abcd").mkdir()

    again = CheckpointStore(tmp_path)
    assert sorted(c.checkpoint_id for c in again.list("m1")) == ["sampler_weights/replaced", "weights/kept",
                                                                  "weights/old-x"]
    assert (folder / "kept" / "weights.txt").read_text() == "v1"
    assert not [d for d in (*folder.iterdir(), *samplers.iterdir()) if d.name.startswith(STAGING_PREFIX)]


def test_forgotten_sampler_weights_are_dropped_once_no_sample_uses_them_and_read_again_after():
    class Weights:
        def __init__(self) -> None:
            self.reads: list[str] = []

        def sampler_weights(self, path: str):
            self.reads.append(path)
            return None, {SCALING: torch.tensor(2.0), "w.lora_A.weight": torch.full((1, 2), float(len(self.reads)))}

    weights = Weights()
    sampling = ActorSampling(weights, ("127.0.0.1:1",), None, "tcp://127.0.0.1:*", "tcp://127.0.0.1:*")

    async def capacity() -> int:
        return 2

    sampling._capacity = capacity

    async def scenario() -> None:
        sampling._bind_loop()
        assert not await sampling.forget("p/a")               # never published
        first = await sampling._acquire("p/a")
        assert await sampling.forget("p/a")                   # in use: retired, still served to its sample
        assert set(sampling.published) == {"p/a"}
        waiting = asyncio.create_task(sampling._acquire("p/a"))
        for _ in range(20):
            await asyncio.sleep(0)
        assert not waiting.done() and weights.reads == ["p/a"]
        await sampling._release(first)
        second = await waiting
        assert weights.reads == ["p/a", "p/a"] and second is not first and second.version > first.version
        assert second.tensors["w.lora_A.weight"][0, 0].item() == 2.0
        await sampling._release(second)
        assert await sampling.forget("p/a")                   # idle: dropped at once
        assert sampling.published == {} and decode_bundle(sampling._set.bundle()) == {}
        await sampling.close()

    asyncio.run(scenario())
