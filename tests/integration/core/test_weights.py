"""The weight transport with a publisher process killed mid-transfer: never a partial version, and the restarted
publisher's version arrives whole. (In one process: unit/test_weights.py.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import torch

from forge.weights import WeightPublisher, WeightSubscriber

from conftest import REPO
from helpers.waiting import wait_for
from helpers.weights import FAST, Received, assert_state_equal, endpoints, mixed_state

CHILD_PUBLISHER = textwrap.dedent("""
    import sys, time, torch
    from forge.weights import Faults, WeightPublisher
    fetch, announce = sys.argv[1], sys.argv[2]
    publisher = WeightPublisher(fetch, announce, chunk_size=64 * 1024, faults=Faults(chunk_delay_s=0.01))
    publisher.publish(1, {"w": torch.zeros(1000)})
    print("published 1", flush=True)
    sys.stdin.readline()
    large = torch.Generator().manual_seed(2)
    publisher.publish(2, {"w": torch.randn(2 * 1024 * 1024, generator=large)})   # 8 MiB, 128 slow chunks
    print("published 2", flush=True)
    time.sleep(600)
""")


def test_a_publisher_killed_mid_transfer_never_yields_a_partial_version(tmp_path, subprocess_env):
    script = tmp_path / "publisher.py"
    script.write_text(CHILD_PUBLISHER)
    fetch, announce = endpoints()
    subprocess_env["PYTHONPATH"] = str(REPO)
    child = subprocess.Popen([sys.executable, str(script), fetch, announce], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env=subprocess_env)
    received = Received()
    try:
        assert child.stdout.readline().strip() == "published 1"
        with WeightSubscriber(fetch, announce, received, window=2, **FAST) as sub:
            assert sub.wait_for_version(1, 20)
            applied_bytes = sub.stats.bytes_received
            child.stdin.write("go\n")
            child.stdin.flush()
            assert child.stdout.readline().strip() == "published 2"
            wait_for(lambda: sub.stats.bytes_received > applied_bytes + 10 * 64 * 1024, "ten chunks of version 2")
            os.kill(child.pid, signal.SIGKILL)
            child.wait(10)
            time.sleep(1.5)   # several request timeouts: the subscriber reconnects and keeps asking
            assert sub.latest_version == 1 and received.versions == [1]
            assert sub.stats.versions_applied == 1 and sub.stats.reconnects >= 1

            # The restarted learner serves version 2 again, with other bytes: nothing of the old partial version
            # may leak into it.
            replacement = {"w": torch.randn(2 * 1024 * 1024), "bias": torch.ones(3, dtype=torch.bfloat16)}
            with WeightPublisher(fetch, announce, chunk_size=64 * 1024) as publisher:
                publisher.publish(2, replacement)
                assert sub.wait_for_version(2, 20)
                assert received.versions == [1, 2]
                assert_state_equal(received.states[2], replacement)
                assert sub.stats.versions_abandoned >= 1
                publisher.publish(3, mixed_state(3))
                assert sub.wait_for_version(3, 10)
    finally:
        child.kill()
        child.wait(10)
