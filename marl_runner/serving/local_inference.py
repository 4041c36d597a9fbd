"""`PolicyClient(inference_mode="local")`: the policies and connectors run in the client.

The client builds its own EnvRunner over an in-client external env, from the
server's config and spaces, and pulls weights and connector state (e.g.
observation filter statistics, merged with what this client's filters saw)
every `update_interval_s`. Only experience batches and filter deltas travel
to the server, on a sender thread so that uploads never hold
up an action.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid

from marl_runner.config import RunnerConfig, space_from_spec
from marl_runner.distributed.filter_states import pop_filter_deltas
from marl_runner.envs import ExternalMultiAgentEnv, register_env
from marl_runner.serving.batches import batch_to_value
from marl_runner.serving.transport import HttpTransport

logger = logging.getLogger(__name__)


class LocalInference:
    """An EnvRunner in this process that serves the client's five calls itself."""

    def __init__(self, transport: HttpTransport, update_interval_s: float) -> None:
        from marl_runner import EnvRunner, MultiAgentBatch  # torch: only for local inference

        self._batch_type = MultiAgentBatch
        self.transport = transport
        self.update_interval_s = update_interval_s
        info = transport.get("info")
        env = ExternalMultiAgentEnv(
            {a: space_from_spec(s) for a, s in info["observation_spaces"].items()},
            {a: space_from_spec(s) for a, s in info["action_spaces"].items()},
        )
        self.env = env
        env_name = f"marl_runner_client_{uuid.uuid4().hex}"
        register_env(env_name, lambda _config: env)
        config = dict(info["config"])
        config["env"] = {"name": env_name, "config": {}, "api": "multi_agent"}
        config["callbacks"] = None  # user callbacks run on the server's runner
        self.runner = EnvRunner(RunnerConfig.from_dict(config))
        self._sync_state()
        self.error: BaseException | None = None
        self.batches_sent = 0
        self._outbox: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._runner_thread = threading.Thread(target=self._sample, name="local-inference", daemon=True)
        self._sender_thread = threading.Thread(target=self._send, name="experience-sender", daemon=True)
        self._runner_thread.start()
        self._sender_thread.start()

    def close(self) -> None:
        """Stops sampling, sends the batches already built, and stops the runner."""
        self._stop.set()
        self._runner_thread.join(10)
        self._outbox.put(None)
        self._sender_thread.join(30)
        self.runner.stop()

    def _sample(self) -> None:
        next_update = time.monotonic() + self.update_interval_s
        try:
            while not self._stop.is_set():
                for item in self.runner.step():
                    if isinstance(item, self._batch_type):
                        self._outbox.put(item)
                if time.monotonic() >= next_update:
                    self._sync_state()
                    next_update = time.monotonic() + self.update_interval_s
        except BaseException as exc:
            self._fail(exc)

    def _sync_state(self) -> None:
        """Our filters' deltas up, the server's weights and merged connector state down."""
        deltas = [[pid, index, stats] for (pid, index), stats in pop_filter_deltas(self.runner).items()]
        self.runner.set_state(self.transport.post("state", {"filter_deltas": deltas}))

    def _send(self) -> None:
        while True:
            batch = self._outbox.get()
            if batch is None:
                return
            try:
                self.transport.post("experiences", batch_to_value(batch))
                self.batches_sent += 1
            except BaseException as exc:
                self._fail(exc)
                return

    def _fail(self, exc: BaseException) -> None:
        if self.error is None:
            self.error = exc
            logger.error("local inference stopped: %r", exc)
            self.runner.env.board.stop(f"local inference failed: {type(exc).__name__}: {exc}")
