"""`marl-runner serve --workers 2`: local inference from two processes on one port.

Both processes take connections; every episode a local-inference client
uploaded (through either) is written once by the main process; weight syncs
work through either; remote-inference calls are refused with 501.
"""

from __future__ import annotations

import signal
import threading

import pytest
from helpers_serve_process import serve_process

from marl_runner.client import PolicyClient
from tests.test_serving_lifecycle import play, written


@pytest.mark.slow
def test_two_processes_serve_local_inference_and_every_upload_is_written_once(tmp_path):
    out = tmp_path / "out"
    with serve_process("--port", "0", "--out", str(out), "--set", "num_envs=4",
                       "--workers", "2") as server:
        assert "(2 processes, local inference only)" in "".join(server.lines)
        seen = set()
        for _ in range(40):  # new connections, spread over the processes by the kernel
            with PolicyClient(server.address) as probe:
                seen.add(probe.health()["process"])
        assert len(seen) == 2, seen
        with PolicyClient(server.address) as remote, pytest.raises(NotImplementedError,
                                                                   match="--workers"):
            remote.start_episode()
        played: list[int] = []
        errors: list[BaseException] = []

        def local_client(seed: int) -> None:
            try:
                with PolicyClient(server.address, inference_mode="local",
                                  update_interval_s=0.2) as client:
                    played.append(play(client, 6, 20, seed))
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=local_client, args=(i,)) for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert not errors, errors
        output = server.finish(signal.SIGINT)
    assert written(out) == (sum(played) * 20, sum(played)), output
    assert f"{sum(played)} batches came from local-inference clients" in output
