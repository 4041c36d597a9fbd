"""`PolicyClient(inference_mode="local")`: the policies and connectors run in the client.

An EnvRunner built here from the server's config and spaces pulls weights and
connector state every `update_interval_s` (filter deltas go up). It builds one
batch per finished episode (`complete_episodes`), uploaded by a sender thread
as soon as it ends, so uploads never hold up an action and nothing finished
is held back at close.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid

from marl_runner.config import RunnerConfig
from marl_runner.distributed.filter_states import pop_filter_deltas
from marl_runner.envs import register_env
from marl_runner.serving.batches import batch_to_value, num_episodes
from marl_runner.serving.transport import HttpTransport
from marl_runner.serving.validation import checks_of_info

logger = logging.getLogger(__name__)


class LocalInference:
    """An EnvRunner in this process that serves the client's five calls itself."""

    def __init__(self, transport: HttpTransport, update_interval_s: float) -> None:
        from marl_runner.batch import MultiAgentBatch
        from marl_runner.sampling.runner import EnvRunner  # torch: only for local inference

        self._batch_type = MultiAgentBatch
        self.transport = transport
        self.update_interval_s = update_interval_s
        info = transport.get("info")
        self.values = checks_of_info(info)  # the server's checks, run at each call
        self.env = env = self.values.env
        env_name = f"marl_runner_client_{uuid.uuid4().hex}"
        register_env(env_name, lambda _config: env)
        config = dict(info["config"])
        config["env"] = {"name": env_name, "config": {}, "api": "multi_agent"}
        config["callbacks"] = None  # user callbacks run on the server's runner
        config["batch_mode"] = "complete_episodes"  # see the module docstring
        self.runner = EnvRunner(RunnerConfig.from_dict(config))
        self._sync_state()
        self.error: BaseException | None = None
        self.batches_sent = 0
        self.episodes_sent = 0
        self._outbox: queue.Queue = queue.Queue()
        self._closing = threading.Event()
        self._runner_thread = threading.Thread(target=self._sample, name="local-inference", daemon=True)
        self._sender_thread = threading.Thread(target=self._send, name="experience-sender", daemon=True)
        self._runner_thread.start()
        self._sender_thread.start()

    def close(self, timeout_s: float = 30.0) -> None:
        """Refuses new calls, uploads every episode ended so far, stops the runner; raises the
        first error on the way."""
        self.runner.env.stop_episodes("the client was closed")
        self._closing.set()
        self._runner_thread.join(timeout_s)
        self._outbox.put(None)
        self._sender_thread.join(timeout_s)
        self.runner.stop()
        if self.error is not None:
            raise self.error
        if self._runner_thread.is_alive() or self._sender_thread.is_alive():
            raise TimeoutError(
                f"local inference: the finished episodes were not all uploaded within {timeout_s}s"
            )

    def _sample(self) -> None:
        """The runner's loop; once closing, it runs until no queued client step is left."""
        env = self.runner.env
        next_update = time.monotonic() + self.update_interval_s
        try:
            while not (self._closing.is_set() and env.drained):
                for item in self.runner.step():
                    if isinstance(item, self._batch_type):
                        self._outbox.put(item)
                if time.monotonic() >= next_update and not self._closing.is_set():
                    self._sync_state()
                    next_update = time.monotonic() + self.update_interval_s
        except BaseException as exc:
            self._fail(exc)

    def _sync_state(self) -> None:
        """Our filters' deltas up, the server's weights and merged connector state down."""
        deltas = [[pid, index, stats] for (pid, index), stats in pop_filter_deltas(self.runner).items()]
        self.runner.set_state(self.transport.post("state", {"filter_deltas": deltas}))

    def _send(self) -> None:
        """Uploads batches in order until the end marker; stops at the first failure."""
        while True:
            batch = self._outbox.get()
            if batch is None:
                return
            try:
                self.transport.post("experiences", batch_to_value(batch))
                self.batches_sent += 1
                self.episodes_sent += num_episodes(batch)
            except BaseException as exc:
                self._fail(exc)
                return

    def _fail(self, exc: BaseException) -> None:
        """Keeps the first error and refuses the client's calls from now on, naming it."""
        if self.error is None:
            self.error = exc
            logger.error("local inference stopped: %r", exc)
            self.runner.env.stop_episodes(f"local inference failed: {type(exc).__name__}: {exc}")
