"""EnvRunnerGroup: N EnvRunners in Ray actors, sampling in parallel, one policy."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterator
from operator import methodcaller
from time import perf_counter
from typing import Any

from marl_runner.batch import concat_multi_agent, concat_samples
from marl_runner.config import RunnerConfig
from marl_runner.config.schema import MAX_RUNNERS
from marl_runner.distributed.filter_states import (
    FilterStates,
    install_filter_states,
    merge_filter_states,
    pop_filter_deltas,
    read_filter_states,
)
from marl_runner.distributed.ray_session import connect_ray
from marl_runner.distributed.runner_actor import RunnerActor
from marl_runner.metrics_merge import merge_metrics

logger = logging.getLogger(__name__)

#: Seeds of different runners are this many sub-envs apart (times num_envs), so
#: that no two runners, nor a runner and its restarted self, seed a sub-env alike.
SEED_STRIDE = 1000
#: How long a runner whose sample raised gets to hand over what it holds (a flush steps
#: no env; it builds fragments from what the runner stored).
SALVAGE_TIMEOUT_S = 60.0


class EnvRunnerGroupError(RuntimeError):
    """The group cannot go on: a runner could not be built, or none is left."""


@dataclasses.dataclass(frozen=True)
class RunnerFault:
    """A remote runner that died: which one, which incarnation, why, and what followed."""

    runner_id: int
    generation: int
    error: str
    restarted: bool

    def __str__(self) -> str:
        then = "restarted" if self.restarted else "dropped (no restarts left)"
        return f"runner {self.runner_id} (generation {self.generation}) died: {self.error}; {then}"


@dataclasses.dataclass
class SampleTotals:
    """What the group's `sample` / `iter_batches` handed out since it was built."""

    batches: int = 0
    env_steps: int = 0
    agent_steps: int = 0
    episodes: int = 0
    faulty_episodes: int = 0


class EnvRunnerGroup:
    """`num_runners` EnvRunners in Ray actors (plus an optional local one), one config.

    Runner 0 is the local runner; remote runners are 1..N, each built from the
    config with its own seed (see `runner_seed`), so that their sub-envs and
    episode ids never coincide, restarts included. At the start every runner
    gets the same policy weights (the local runner's, else runner 1's).

    With remote runners, `sample` and `iter_batches` sample on them (the local
    runner only holds weights); without, on the local runner. A remote runner
    that dies (killed, OOM, or a sample slower than `sample_timeout_s`) loses
    its unfinished sample - never handed out - and is restarted, up to
    `max_restarts` times per runner, with the group's current weights and
    filter statistics; then it is dropped. One whose sample raises is alive:
    it first hands over what it holds (`EnvRunner.flush`: the fragments it
    built, its finished episodes), which comes out with the group's next batch,
    and is then replaced the same way. The others go on untouched. `faults`
    lists every death or failed sample with its cause.

    Args:
        config: the runner config (or its dict form).
        num_runners: remote runners; None: `config.num_runners`.
        local_runner: also build a runner in this process (always when there
            are no remote runners).
        max_restarts: restarts per remote runner; None: `config.max_runner_restarts`.
        num_cpus_per_runner: Ray CPUs each runner actor reserves (fractions
            let more runners than CPUs share a machine).
        ray_address: the cluster to join; None: `config.ray_address`, and
            when that is None too, the running cluster or a new local Ray.
        sample_timeout_s: a remote sample slower than this counts as a
            death; None: wait as long as it takes.
        policies, policy_mapping_fn, callbacks: as for `EnvRunner` (pickled
            to each runner).
    """

    def __init__(
        self,
        config: RunnerConfig | dict,
        num_runners: int | None = None,
        local_runner: bool = False,
        max_restarts: int | None = None,
        *,
        num_cpus_per_runner: float = 1.0,
        ray_address: str | None = None,
        sample_timeout_s: float | None = None,
        policies: dict[str, Any] | None = None,
        policy_mapping_fn: Callable[..., str] | None = None,
        callbacks: Any = None,
    ) -> None:
        if isinstance(config, dict):
            config = RunnerConfig.from_dict(config)
        self.config = config
        num_runners = config.num_runners if num_runners is None else num_runners
        max_restarts = config.max_runner_restarts if max_restarts is None else max_restarts
        for name, value in (("num_runners", num_runners), ("max_restarts", max_restarts)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"EnvRunnerGroup {name} {value!r}: expected an int >= 0")
        if num_runners > MAX_RUNNERS:  # (Ray's resource arithmetic fails past it, unnamed)
            raise ValueError(
                f"EnvRunnerGroup num_runners {num_runners:.3g}: expected at most {MAX_RUNNERS:,}"
            )
        self.num_runners = num_runners
        self.max_restarts = max_restarts
        self.sample_timeout_s = sample_timeout_s
        self.faults: list[RunnerFault] = []
        self.totals = SampleTotals()
        self.num_runner_restarts = 0
        self._faults_reported = 0
        self._runner_kwargs = {
            key: value
            for key, value in (
                ("policies", policies),
                ("policy_mapping_fn", policy_mapping_fn),
                ("callbacks", callbacks),
            )
            if value is not None
        }
        self._remote: dict[int, Any] = {}
        self._generation: dict[int, int] = {}
        self._restarts: dict[int, int] = {}
        #: One sample request per busy remote runner: ref -> (runner id, start time).
        self._in_flight: dict[Any, tuple[int, float]] = {}
        #: What remote runners whose sample raised handed over, not handed out yet.
        self._salvaged: list[Any] = []
        self._weights_ref: Any = None
        self._filter_states: FilterStates = {}
        self._metric_parts: list[dict[str, Any]] = []
        self._metrics_since = perf_counter()
        self._owns_ray = False
        self._stopped = False
        self.local_runner = None
        try:
            if local_runner or num_runners == 0:
                from marl_runner.sampling.runner import EnvRunner  # imports torch

                self.local_runner = EnvRunner(config, **self._runner_kwargs)
            if num_runners:
                self._start_remote(num_cpus_per_runner, ray_address or config.ray_address)
            elif self.local_runner is not None:
                self._filter_states = read_filter_states(self.local_runner)
        except BaseException:
            self.stop()
            raise

    # ------------------------------------------------------------------ sampling

    def sample(self, **sample_kwargs: Any) -> Any:
        """One batch from every healthy runner, gathered in parallel, as one MultiAgentBatch.

        `sample_kwargs` (`num_env_steps`, `num_agent_steps`, `num_episodes`)
        go to each runner's `EnvRunner.sample`. A runner that dies meanwhile
        is restarted and asked again; one that cannot be restarted is left out.
        """
        if not self.num_runners:
            return self._sample_locally(sample_kwargs)
        batches = []
        done: set[int] = set()
        while wanted := set(self._remote) - done:
            self._request_samples(wanted, sample_kwargs)
            batch, runner_id = self._next_result()
            if batch is not None:
                batches.append(batch)
                done.add(runner_id)
        batches.extend(self._pop_salvaged())
        if not batches:
            raise EnvRunnerGroupError(f"no healthy runners left; faults: {self._fault_text()}")
        return concat_samples(batches)

    def iter_batches(self, num_batches: int | None = None, **sample_kwargs: Any) -> Iterator[Any]:
        """Each runner's batch as soon as it is ready, `num_batches` of them (None: forever).

        Every remote runner keeps one sample request going, so a fast runner
        never waits for a slow one. Requests still running when the loop
        stops are kept: the next `sample` / `iter_batches` hands them out,
        so no sampled data is lost or repeated.
        """
        produced = 0
        while num_batches is None or produced < num_batches:
            if not self.num_runners:
                produced += 1
                yield self._sample_locally(sample_kwargs)
                continue
            self._request_samples(set(self._remote), sample_kwargs)
            batch, runner_id = self._next_result()
            if batch is None:  # the runner died; a failed sample's rows may have come out
                salvaged = self._pop_salvaged()
                if not salvaged:
                    continue
                batch = concat_samples(salvaged)
            produced += 1
            if (num_batches is None or produced < num_batches) and runner_id in self._remote:
                self._request_samples({runner_id}, sample_kwargs)  # busy while the caller works
            yield batch

    def request_stop(self, flush: bool = True) -> None:
        """The local runner's `sample()` returns at the end of its round (`EnvRunner.
        request_stop`, ``flush`` as there); a remote runner's running sample finishes as it
        would. Only sets flags: a Ctrl-C or SIGTERM handler may call it."""
        if self.local_runner is not None:
            self.local_runner.request_stop(flush)

    def flush(self) -> Any:
        """Everything the runners sampled and have not handed out, as one MultiAgentBatch,
        for the end of a run, so that every finished episode gets out: the samples still
        running (waited for: one sample's time at most), then each runner's
        `EnvRunner.flush()`. A runner that dies meanwhile loses its part, as in `sample`."""
        if not self.num_runners:
            batch = self.local_runner.flush()
            self._note_sample(batch, self.local_runner.get_metrics())
            return batch
        batches = []
        while self._in_flight:
            batch, _ = self._next_result()
            if batch is not None:
                batches.append(batch)
        for batch, metrics in self._call_remote("flush", replace_raising=True).values():
            self._note_sample(batch, metrics)
            batches.append(batch)
        batches.extend(self._pop_salvaged())
        return concat_multi_agent(batches)

    # ------------------------------------------------------------------ weights and state

    def sync_weights(self, weights: dict[str, Any] | None = None) -> None:
        """Send `weights` (None: the local runner's, else the last ones sent) to every
        remote runner, putting them in the object store once."""
        if weights is not None and self.local_runner is not None:
            self.local_runner.set_weights(weights)
        if weights is None and self.local_runner is not None:
            weights = self.local_runner.get_weights()
        if not self._remote:
            return
        import ray

        if weights is not None:
            self._weights_ref = ray.put(weights)
        if self._weights_ref is None:
            raise EnvRunnerGroupError("sync_weights: no weights given and no local runner")
        self._call_remote("set_weights", self._weights_ref)

    def sync_connector_states(self) -> FilterStates:
        """Gather what every runner's observation filters saw since the last sync, merge
        it exactly into the group's statistics and install them on every runner.

        Returns the merged statistics, keyed `(policy_id, connector position)`.
        """
        deltas = []
        if self.local_runner is not None:
            deltas.append(pop_filter_deltas(self.local_runner))
        deltas.extend(self._call_remote("pop_filter_deltas").values())
        self._filter_states = merge_filter_states(self._filter_states, deltas)
        if self.local_runner is not None:
            install_filter_states(self.local_runner, self._filter_states)
        if self._remote:
            import ray

            self._call_remote("install_filter_states", ray.put(self._filter_states))
        return self._filter_states

    def policy_versions(self) -> list[dict[str, int]]:
        """Each healthy runner's ``policy_id -> policy_version`` (the local runner's first,
        then the remote ones by runner id): how many times its weights were set, so a trainer
        can tell which runners sample with older weights. A restarted runner counts anew."""
        return self.foreach_runner(methodcaller("policy_versions"))

    def foreach_runner(self, fn: Callable[..., Any], *, local: bool = True) -> list[Any]:
        """`fn(runner)` on every healthy runner (the local one first when `local`);
        a runner found dead is restarted and left out of the results."""
        results = []
        if local and self.local_runner is not None:
            results.append(fn(self.local_runner))
        results.extend(self._call_remote("apply", fn).values())
        return results

    # ------------------------------------------------------------------ health and metrics

    def remote_runners(self) -> dict[int, Any]:
        """The Ray actor handle of every healthy remote runner, by runner id: for calls
        the group has no method for, and for fault drills (`ray.kill` one)."""
        return dict(self._remote)

    def healthy_runner_ids(self) -> list[int]:
        """Ids of the remote runners in service (restarted ones included, dropped ones not):
        a trainer can tell how much parallelism it has left."""
        return sorted(self._remote)

    def get_metrics(self) -> dict[str, Any]:
        """Metrics of every sample handed out since the last call, merged (rates over the
        wall time since then), plus `num_healthy_runners`, `num_runner_restarts` and
        `runner_faults` (descriptions of the deaths since the last call)."""
        now = perf_counter()
        metrics = merge_metrics(self._metric_parts, now - self._metrics_since)
        metrics["num_healthy_runners"] = len(self._remote) if self.num_runners else 1
        metrics["num_runner_restarts"] = self.num_runner_restarts
        metrics["runner_faults"] = [str(fault) for fault in self.faults[self._faults_reported:]]
        self._faults_reported = len(self.faults)
        self._metric_parts = []
        self._metrics_since = now
        return metrics

    def stop(self) -> None:
        """Stop every runner and end their actors; disconnect from Ray if this group connected."""
        if self._stopped:
            return
        self._stopped = True
        if self.local_runner is not None:
            self.local_runner.stop()
        if self._remote or self._owns_ray:
            import ray

            stops = [actor.stop.remote() for actor in self._remote.values()]
            ray.wait(stops, num_returns=len(stops), timeout=10.0)  # close sub-envs cleanly
            for actor in self._remote.values():
                ray.kill(actor, no_restart=True)
            self._remote.clear()
            self._in_flight.clear()
            if self._owns_ray:
                ray.shutdown()

    def __enter__(self) -> EnvRunnerGroup:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ internals

    def runner_seed(self, runner_id: int, generation: int = 0) -> int | None:
        """The seed of runner `runner_id`'s `generation`-th incarnation (0: the first)."""
        if self.config.seed is None:
            return None
        if runner_id == 0:
            return self.config.seed
        slot = generation * (self.num_runners + 1) + runner_id
        return self.config.seed + slot * SEED_STRIDE * self.config.num_envs

    def _start_remote(self, num_cpus_per_runner: float, address: str | None) -> None:
        import ray

        self._owns_ray = connect_ray(address)
        needed = num_cpus_per_runner * self.num_runners
        available = ray.cluster_resources().get("CPU", 0)
        if needed > available:
            raise EnvRunnerGroupError(
                f"{self.num_runners} runners x num_cpus_per_runner={num_cpus_per_runner} need "
                f"{needed} CPUs but the Ray cluster has {available}; lower num_cpus_per_runner "
                "(fractions are fine) or add nodes"
            )
        self._actor_class = ray.remote(num_cpus=num_cpus_per_runner, max_restarts=0)(RunnerActor)
        for runner_id in range(1, self.num_runners + 1):
            self._remote[runner_id] = self._create(runner_id)
        for runner_id, actor in self._remote.items():
            try:
                ray.get(actor.ready.remote())
            except Exception as error:
                raise EnvRunnerGroupError(
                    f"runner {runner_id} could not be built: {_describe(error)}"
                ) from error
        if self.local_runner is not None:
            self._filter_states = read_filter_states(self.local_runner)
            self.sync_weights()
        else:
            first = self._remote[1]
            self._filter_states = ray.get(first.read_filter_states.remote())
            self.sync_weights(ray.get(first.get_weights.remote()))

    def _create(self, runner_id: int) -> Any:
        generation = self._generation.get(runner_id, -1) + 1
        self._generation[runner_id] = generation
        config = dataclasses.replace(self.config, seed=self.runner_seed(runner_id, generation))
        return self._actor_class.remote(config, self._runner_kwargs)

    def _sample_locally(self, sample_kwargs: dict[str, Any]) -> Any:
        batch = self.local_runner.sample(**sample_kwargs)
        self._note_sample(batch, self.local_runner.get_metrics())
        return batch

    def _note_sample(self, batch: Any, metrics: dict[str, Any]) -> None:
        self._metric_parts.append(metrics)
        totals = self.totals
        totals.batches += bool(batch.agent_steps())  # not an empty flush
        totals.env_steps += batch.env_steps()
        totals.agent_steps += batch.agent_steps()
        totals.episodes += metrics.get("episodes", 0)
        totals.faulty_episodes += metrics.get("num_faulty_episodes", 0)

    def _request_samples(self, runner_ids: set[int], sample_kwargs: dict[str, Any]) -> None:
        busy = {runner_id for runner_id, _ in self._in_flight.values()}
        now = perf_counter()
        for runner_id in sorted(runner_ids - busy):
            ref = self._remote[runner_id].sample.remote(sample_kwargs)
            self._in_flight[ref] = (runner_id, now)

    def _next_result(self) -> tuple[Any, int]:
        """`(batch, runner_id)` of the first sample to finish; `(None, runner_id)` when
        that runner died instead (it has been restarted or dropped)."""
        import ray

        while True:
            if not self._in_flight:
                raise EnvRunnerGroupError(f"no healthy runners left; faults: {self._fault_text()}")
            timeout = None
            if self.sample_timeout_s is not None:
                oldest = min(start for _, start in self._in_flight.values())
                timeout = max(oldest + self.sample_timeout_s - perf_counter(), 0.0)
            ready, _ = ray.wait(list(self._in_flight), num_returns=1, timeout=timeout)
            if ready:
                break
            now = perf_counter()
            for runner_id, start in list(self._in_flight.values()):
                if now - start >= self.sample_timeout_s:
                    self._restart(runner_id, f"sample took longer than {self.sample_timeout_s} s")
                    return None, runner_id
        ref = ready[0]
        runner_id, _ = self._in_flight.pop(ref)
        try:
            batch, metrics = ray.get(ref)
        except ray.exceptions.RayActorError as error:
            self._restart(runner_id, _describe(error))
            return None, runner_id
        except ray.exceptions.RayError as error:
            # The sample raised (a RayTaskError; or its error could not be sent back, say
            # an exception the driver cannot unpickle): the runner lives, and hands over
            # what it holds before it is replaced.
            handed_over = self._salvage(runner_id)
            cause = _describe_cause(error)
            self._restart(runner_id, f"its sample raised {cause} ({handed_over})")
            return None, runner_id
        self._note_sample(batch, metrics)
        return batch, runner_id

    def _salvage(self, runner_id: int) -> str:
        """What a runner whose sample raised holds (its `flush()`: the fragments that
        sample built, and its sub-envs' rows since, finished episodes among them) goes
        out with the group's next batch; lost only if the flush fails too. Says which."""
        import ray

        try:
            batch, metrics = ray.get(
                self._remote[runner_id].flush.remote(), timeout=SALVAGE_TIMEOUT_S
            )
        except ray.exceptions.RayError as error:
            return f"what it held is lost: its flush failed too: {_describe(error)}"
        self._note_sample(batch, metrics)
        if batch.agent_steps():
            self._salvaged.append(batch)
        return f"it handed over {batch.env_steps()} env steps first"

    def _pop_salvaged(self) -> list[Any]:
        salvaged, self._salvaged = self._salvaged, []
        return salvaged

    def _call_remote(
        self, method: str, *args: Any, replace_raising: bool = False
    ) -> dict[int, Any]:
        """`method(*args)` on every remote runner; dead ones are restarted and left out,
        and with `replace_raising` so are those whose call raised (else its error is
        raised): a flush that raises in one runner keeps the others' data."""
        if not self._remote:
            return {}
        import ray

        refs = {
            runner_id: getattr(actor, method).remote(*args)
            for runner_id, actor in list(self._remote.items())
        }
        results = {}
        for runner_id, ref in refs.items():
            try:
                results[runner_id] = ray.get(ref)
            except ray.exceptions.RayActorError as error:
                self._restart(runner_id, _describe(error))
            except ray.exceptions.RayError as error:  # the call raised; the runner lives
                if not replace_raising:
                    raise
                cause = _describe_cause(error)
                self._restart(runner_id, f"its {method} raised {cause} (what it held is lost)")
        return results

    def _restart(self, runner_id: int, reason: str) -> None:
        """Replace a dead runner by a fresh one with the group's weights and filter
        statistics, or drop it when its restarts are used up."""
        import ray

        for ref, (owner, _) in list(self._in_flight.items()):
            if owner == runner_id:
                del self._in_flight[ref]  # its partial work is gone with it
        old = self._remote.pop(runner_id)
        ray.kill(old, no_restart=True)
        restarts = self._restarts.get(runner_id, 0)
        restarted = restarts < self.max_restarts
        fault = RunnerFault(runner_id, self._generation[runner_id], reason, restarted)
        self.faults.append(fault)
        logger.warning("%s", fault)
        if not restarted:
            return
        self._restarts[runner_id] = restarts + 1
        self.num_runner_restarts += 1
        actor = self._create(runner_id)
        # Actor calls run in order: these finish before any sample sent later.
        if self._weights_ref is not None:
            actor.set_weights.remote(self._weights_ref)
        if self._filter_states:
            actor.install_filter_states.remote(self._filter_states)
        self._remote[runner_id] = actor

    def _fault_text(self) -> str:
        return "; ".join(str(fault) for fault in self.faults) or "none"


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}".strip().splitlines()[0][:500]


def _describe_cause(error: BaseException) -> str:
    """What a remote call raised (a RayTaskError's cause), not Ray's task header."""
    return _describe(getattr(error, "cause", None) or error)
