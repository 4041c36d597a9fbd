"""A policy around a torch model: one batched forward pass per runner round."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from marl_runner.policy.action_heads import CategoricalHead, make_action_head
from marl_runner.policy.action_spaces import action_feature_size, check_action_mask, encode_actions
from marl_runner.policy.base import EpisodeView, Policy, PolicyOutput
from marl_runner.policy.gae import compute_gae, parse_gae_config
from marl_runner.policy.models import build_model, check_model_weights, is_recurrent_model
from marl_runner.policy.numpy_mlp import NumpyMLP
from marl_runner.policy.numpy_sampling import NumpyCategoricalSampler
from marl_runner.policy.sequences import sequence_starts, unroll
from marl_runner.policy.torch_utils import (
    packed_to_numpy,
    resolve_device,
    restore_generator,
    seeded_cpu_rng,
)

if TYPE_CHECKING:
    from marl_runner.batch import SampleBatch

__all__ = ["TorchPolicy"]

_DEFAULTS: dict[str, Any] = {
    "model": {"type": "mlp"},
    "device": "cpu",
    "seed": None,
    "explore": True,
    "gae": None,
    "view_requirements": {},
    "cpu_inference": "numpy",
}
_CPU_INFERENCE = ("numpy", "torch")
_VIEW_HINT = "the policy declares it as a view requirement; the agent connectors must provide it"
_STATE_HINT = (
    "a recurrent policy needs one row of state per agent; the StateBufferConnector adds it"
)


class TorchPolicy(Policy):
    """Wraps a torch model with Discrete, MultiDiscrete or Box actions.

    Config keys: ``model`` (``{type: mlp, hidden, activation,
    vf_share_layers}``, ``{type: lstm, hidden, activation, lstm_cell_size}``,
    ``{type: cnn, conv, hidden, activation, vf_share_layers}`` or
    ``{class: "pkg.mod:Cls", **kwargs}``; see ``models``), ``device``
    (``cpu | cuda | auto``), ``seed`` (seeds weight init and a private
    generator used only for sampling, so equal seeds give equal actions
    whatever else uses torch's global RNG; a numpy generator for Discrete
    actions on CPU, a torch one otherwise), ``explore`` (default True),
    ``gae`` (``{gamma, lambda}``: adds advantages/value targets in
    :meth:`postprocess_trajectory`) and ``view_requirements`` (declaring
    ``prev_actions`` / ``prev_rewards`` feeds those columns to the model,
    one-hot encoded for discrete actions, after the observation) and
    ``cpu_inference`` (``numpy``, the default: on CPU the built-in ``mlp``
    model's sampling forward pass runs in numpy on views of its weights, ~3x
    faster at sampling sizes, see ``numpy_mlp``; ``torch``: always the torch
    module, e.g. for hooks added to the model).

    Observations: the ``cnn`` model takes image observations (a Box
    ``(H, W, C)``, uint8 frames as the ObsPreprocessorConnector keeps them)
    unflattened and in their own dtype; every other model takes them
    flattened to float32 (images too, unscaled).

    Extra outputs: ``action_logp`` [n] (log-prob of the returned action under
    the masked distribution, also when not exploring), ``action_dist_inputs``
    [n, k] (masked logits, or ``[mean, log_std]`` for Box) and ``vf_preds``
    [n], all float32.

    Training: :meth:`evaluate` re-runs the model on a batch with gradients
    and returns ``(logp, entropy, values)`` of the stored actions;
    :meth:`parameters` is what an optimiser steps. ``model`` is the torch
    model built from the ``model`` config, ``action_head`` turns its outputs
    into a distribution (it holds Box's ``log_std``), and ``network`` is the
    one module holding both (for ``state_dict``, ``.to``, ``.train``).
    """

    def __init__(
        self,
        observation_space: gym.Space,
        action_space: gym.Space,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        config = dict(config or {})
        unknown = sorted(set(config) - set(_DEFAULTS))
        if unknown:
            raise ValueError(
                f"unknown TorchPolicy config key(s) {unknown}; expected some of {sorted(_DEFAULTS)}"
            )
        super().__init__(observation_space, action_space, {**_DEFAULTS, **config})
        if self.config["cpu_inference"] not in _CPU_INFERENCE:
            raise ValueError(
                f"TorchPolicy config 'cpu_inference' must be one of {list(_CPU_INFERENCE)}, got "
                f"{self.config['cpu_inference']!r}"
            )
        if not isinstance(observation_space, gym.spaces.Box):
            raise ValueError(
                f"TorchPolicy needs a Box observation space (flat Box, or a uint8 image "
                f"(H, W, C) for a cnn model), got {observation_space}; the "
                "ObsPreprocessorConnector flattens Dict/Tuple/Discrete observations upstream, "
                "so keep it in the policy's agent connectors"
            )
        self._use_prev_actions = "prev_actions" in self.view_requirements
        self._use_prev_rewards = "prev_rewards" in self.view_requirements
        self._gae = parse_gae_config(self.config["gae"])
        self.device = resolve_device(self.config["device"])
        self._on_cpu = self.device.type == "cpu"
        self._action_dtype = np.dtype(action_space.dtype)

        self._obs_dim = int(np.prod(observation_space.shape))
        self._image_input = self._check_image_model(observation_space)
        input_dim = self._obs_dim
        if self._use_prev_actions:
            input_dim += action_feature_size(action_space)
        if self._use_prev_rewards:
            input_dim += 1
        seed = self.config["seed"]
        with seeded_cpu_rng(seed):
            self.action_head = make_action_head(action_space)
            check_model_weights(  # (meta tensors draw no random numbers)
                self.config["model"], input_dim, self.action_head.num_model_outputs,
                observation_space.shape,
            )
            self.model = build_model(
                self.config["model"],
                input_dim,
                self.action_head.num_model_outputs,
                obs_shape=observation_space.shape,
            )
        # One module, so that weights, devices and train/eval modes cover both parts.
        self.network = nn.ModuleDict({"model": self.model, "action_head": self.action_head})
        self.network.to(self.device).eval()

        self._recurrent = is_recurrent_model(self.model)
        self._numpy_mlp = (
            NumpyMLP.for_model(self.model)
            if self._on_cpu and self.config["cpu_inference"] == "numpy"
            else None
        )
        self._initial_state = (
            [s.detach().cpu().numpy().astype(np.float32) for s in self.model.get_initial_state()]
            if self._recurrent
            else []
        )
        # Discrete actions on CPU: the post-model work runs in numpy, drawing from the
        # sampler's own generator (see numpy_sampling); every other head samples in torch.
        self._numpy_sampler: NumpyCategoricalSampler | None = None
        self._generator: torch.Generator | None = None
        if self._on_cpu and isinstance(self.action_head, CategoricalHead):
            self._numpy_sampler = NumpyCategoricalSampler(
                self.action_head.num_model_outputs,
                self.action_head.start,
                None if seed is None else int(seed),
            )
        else:
            self._generator = torch.Generator(device=self.device)
            if seed is None:
                self._generator.seed()
            else:
                self._generator.manual_seed(int(seed))

    def _check_image_model(self, observation_space: gym.spaces.Box) -> bool:
        """Whether the model takes images unflattened (``cnn``); raises where it cannot."""
        model = self.config["model"]
        if not (isinstance(model, Mapping) and model.get("type") == "cnn"):
            return False
        if len(observation_space.shape) != 3:
            raise ValueError(
                f"model type 'cnn' needs image observations, a Box of shape (height, width, "
                f"channels), but the policy's observation space is {observation_space}; use an "
                "mlp model, or keep the env's uint8 frames (frame stacking puts frames on the "
                "channel axis only for uint8 images)"
            )
        if self._use_prev_actions or self._use_prev_rewards:
            raise ValueError(
                "model type 'cnn' takes only the observation; drop prev_actions/prev_rewards "
                "from the view requirements"
            )
        return True

    def get_initial_state(self) -> list[np.ndarray]:
        """The model's state for a fresh agent, copies (one array per state tensor)."""
        return [state.copy() for state in self._initial_state]

    def num_state_tensors(self) -> int:
        """How many state arrays the model carries (0 for mlp and cnn)."""
        return len(self._initial_state)

    def is_recurrent(self) -> bool:
        """Whether the model is recurrent (``lstm``)."""
        return self._recurrent

    def compute_actions_from_input_dict(
        self,
        input_dict: Mapping[str, Any],
        explore: bool | None = None,
        timestep: int | None = None,
    ) -> PolicyOutput:
        """One forward pass over all rows; ``timestep`` is not used.

        Written for the per-call cost (the runner calls it once per policy per
        round): no device moves or dtype casts that would be no-ops; on CPU the
        built-in mlp runs in numpy (``numpy_mlp``) and Discrete actions are
        drawn in numpy (``numpy_sampling``), small numpy ops costing a fraction
        of torch's there; otherwise one fused call into the action head.
        """
        explore = self.config["explore"] if explore is None else explore
        model_input = self._model_input(input_dict)
        mask = (
            check_action_mask(input_dict["action_mask"], self.action_space, len(model_input))
            if "action_mask" in input_dict
            else None
        )
        states = self._state_inputs(input_dict) if self._recurrent else []
        model_outputs = self._numpy_outputs(model_input)
        if model_outputs is not None and self._numpy_sampler is not None:
            # The whole pass in numpy (numpy_mlp, numpy_sampling): not one torch call.
            logits, values = model_outputs
            actions, logp, dist_inputs = self._numpy_sampler.act(logits, mask, bool(explore))
            state_outs = []
        else:
            actions, logp, dist_inputs, values, state_outs = self._torch_actions(
                model_input, states, model_outputs, mask, bool(explore)
            )
        extra = {"action_logp": logp, "action_dist_inputs": dist_inputs, "vf_preds": values}
        if actions.dtype != self._action_dtype:
            actions = actions.astype(self._action_dtype)
        return actions, state_outs, extra

    def parameters(self) -> Iterator[nn.Parameter]:
        """Every trainable tensor: the model's and the action head's (Box ``log_std``)."""
        return self.network.parameters()

    def evaluate(
        self, batch: Mapping[str, Any], seq_lens: Sequence[int] | np.ndarray | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(logp, entropy, values)``, each ``[n]``, for the stored ``actions`` of ``batch``.

        One forward pass with gradients (call it outside inference mode) over
        the same inputs sampling used: ``obs``, the declared ``prev_actions`` /
        ``prev_rewards``, the ``action_mask`` column when present (masked
        actions get a log-prob near the lowest float and add no entropy) and,
        for a recurrent model, the stored ``state_in_*`` columns.

        By default every row is its own sequence of length 1, as the runner
        stores them, so rows may be shuffled into minibatches and gradients do
        not flow back through time. For backpropagation through time pass
        ``seq_lens``: the rows, in order, are that many consecutive steps each
        (``marl_runner.policy.sequences.sequence_lengths`` cuts a batch into
        one agent's runs); a recurrent model then starts each sequence from its
        first row's stored state and carries its own state along it. Either
        way, with unchanged weights ``logp`` equals the batch's ``action_logp``.

        Raises:
            ValueError: a missing column, or ``seq_lens`` that do not cover the rows.
        """
        if "seq_lens" in batch and np.any(np.asarray(batch["seq_lens"]) != 1):
            raise ValueError(
                "the batch's seq_lens column must be ones (one step per row, as the runner "
                f"stores them), got {np.unique(np.asarray(batch['seq_lens'])).tolist()}; pass "
                "sequences as evaluate(batch, seq_lens=...)"
            )
        model_input = self._model_input(batch)
        actions = _required_column(batch, "actions", "evaluate() scores the stored actions")
        mask = (
            check_action_mask(batch["action_mask"], self.action_space, len(model_input))
            if "action_mask" in batch
            else None
        )
        states = self._state_inputs(batch)
        if seq_lens is not None and self._recurrent:
            model_out, values = unroll(
                self.model,
                torch.from_numpy(model_input).to(self.device),
                [torch.from_numpy(state).to(self.device) for state in states],
                seq_lens,
            )
        else:
            if seq_lens is not None:  # rows are independent here; still, they must be covered
                sequence_starts(seq_lens, len(model_input))
            model_out, values, _ = self._forward(model_input, states)
        mask_t = None if mask is None else torch.from_numpy(mask).to(self.device)
        dist_inputs = self.action_head.distribution_inputs(model_out, mask_t)
        actions_t = torch.as_tensor(np.asarray(actions), device=self.device)
        logp = self.action_head.log_prob(dist_inputs, actions_t)
        return logp, self.action_head.entropy(dist_inputs), values

    def score_logged_actions(
        self, outputs: Mapping[str, Any], rows: np.ndarray, actions: np.ndarray
    ) -> np.ndarray | None:
        """The action head's log-prob of each logged action under the stored
        ``action_dist_inputs`` (masks applied there): what :meth:`evaluate` gives."""
        dist_inputs = outputs.get("action_dist_inputs")
        if dist_inputs is None:
            return None
        with torch.no_grad():
            logp = self.action_head.log_prob(
                torch.as_tensor(np.asarray(dist_inputs)[rows], device=self.device),
                torch.as_tensor(np.asarray(actions), device=self.device),
            )
        return logp.cpu().numpy()

    def wants_postprocessing(self) -> bool:
        """Only with ``gae`` configured: otherwise batches need no per-trajectory pass."""
        return self._gae is not None

    def postprocess_trajectory(
        self,
        batch: SampleBatch,
        other_agent_batches: Mapping[Any, Any] | None = None,
        episode: EpisodeView | None = None,
    ) -> SampleBatch:
        """Adds ``advantages`` and ``value_targets`` (GAE) when the config has ``gae``.

        ``batch`` is one agent's trajectory in time order; the runner calls
        this once per trajectory when :meth:`wants_postprocessing` is true
        (enable it with the policy config ``gae: {gamma: 0.99, lambda: 0.95}``).
        How the return after the last row is estimated:

        - last row **terminated**: the episode really ended, the future is
          worth 0, no bootstrap;
        - otherwise (episode **truncated** by a time limit, or a fragment cut
          mid-episode): the value of the last row's ``new_obs`` (one forward
          pass, with the last ``state_out_*`` for a recurrent model).

        ``value_targets`` are ``advantages + vf_preds`` (lambda-returns).
        """
        if self._gae is None:
            return batch
        for column in ("rewards", "vf_preds", "terminateds", "new_obs"):
            if column not in batch:
                raise ValueError(f"GAE needs the {column!r} column; the batch has {sorted(batch)}")
        rewards = np.asarray(batch["rewards"])
        if len(rewards) == 0 or bool(batch["terminateds"][-1]):
            last_value = 0.0
        else:
            last_value = self._bootstrap_value(batch)
        batch["advantages"], batch["value_targets"] = compute_gae(
            rewards, batch["vf_preds"], last_value, self._gae.gamma, self._gae.lambda_
        )
        return batch

    def get_weights(self) -> dict[str, np.ndarray]:
        """Copies of the network's tensors (model and action head) as numpy arrays."""
        return {
            name: tensor.detach().to("cpu", copy=True).numpy()
            for name, tensor in self.network.state_dict().items()
        }

    def set_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        """Loads ``get_weights``'s arrays into the network (model and action head)."""
        self.network.load_state_dict(
            {name: torch.as_tensor(np.asarray(w)) for name, w in weights.items()}
        )

    def get_state(self) -> dict[str, Any]:
        """Weights plus the sampling generator, so a restored policy draws the same actions.

        ``sampler_rng_state`` is the numpy sampler's ``uint64[6]`` state (Discrete on
        CPU) or the torch generator's ``uint8`` state (every other policy).
        """
        if self._numpy_sampler is not None:
            rng_state = self._numpy_sampler.get_state()
        else:
            rng_state = self._generator.get_state().numpy()
        return {**super().get_state(), "sampler_rng_state": rng_state}

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Weights, and the sampling generator when the state has it.

        A state of another generator kind (a torch state in a Discrete CPU policy,
        as policies saved before it sampled in numpy stored; a numpy or CPU state
        in a policy on CUDA) seeds the generator instead of continuing it.
        """
        super().set_state(state)
        if "sampler_rng_state" not in state:
            return
        if self._numpy_sampler is not None:
            self._numpy_sampler.set_state(state["sampler_rng_state"])
        else:
            restore_generator(self._generator, state["sampler_rng_state"])

    def _model_input(self, input_dict: Mapping[str, Any]) -> np.ndarray:
        """Flat float32 ``[n, input_dim]``: obs, then the declared previous action/reward.

        For an image model: the obs ``[n, H, W, C]`` in the space's dtype (uint8
        frames go to the model as they are; it scales them).
        """
        dtype = self.observation_space.dtype if self._image_input else np.float32
        obs = np.asarray(input_dict["obs"], dtype=dtype)
        if obs.shape[1:] != self.observation_space.shape:
            raise ValueError(
                f"obs rows have shape {obs.shape[1:]}, but the policy's observation space is "
                f"{self.observation_space}"
            )
        if self._image_input:
            return obs
        parts = [obs.reshape(len(obs), self._obs_dim)]
        if self._use_prev_actions:
            prev_actions = _required_column(input_dict, "prev_actions", _VIEW_HINT)
            parts.append(encode_actions(prev_actions, self.action_space))
        if self._use_prev_rewards:
            prev_rewards = _required_column(input_dict, "prev_rewards", _VIEW_HINT)
            parts.append(np.asarray(prev_rewards, dtype=np.float32).reshape(len(obs), 1))
        return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)

    def _state_inputs(self, input_dict: Mapping[str, Any]) -> list[np.ndarray]:
        return [
            np.asarray(_required_column(input_dict, f"state_in_{i}", _STATE_HINT), dtype=np.float32)
            for i in range(len(self._initial_state))
        ]

    def _forward(
        self, model_input: np.ndarray, states: list[np.ndarray]
    ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        """``(model_out, values [n], state_outs)`` from numpy inputs; call under inference mode."""
        obs_t = self._to_device(torch.from_numpy(model_input))
        if not self._recurrent:
            model_out, values = self.model(obs_t)
            return model_out, values.reshape(-1), []
        states_t = [torch.from_numpy(s).to(self.device) for s in states]
        model_out, values, state_outs = self.model(obs_t, states_t)
        return model_out, values.reshape(-1), list(state_outs)

    def _numpy_outputs(self, model_input: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """``(logits, values)`` from the numpy mlp; None where torch must run the model."""
        return self._numpy_mlp(model_input) if self._numpy_mlp is not None else None

    def _torch_actions(
        self,
        model_input: np.ndarray,
        states: list[np.ndarray],
        model_outputs: tuple[np.ndarray, np.ndarray] | None,
        mask: np.ndarray | None,
        explore: bool,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[np.ndarray]]:
        """``(actions, logp, dist_inputs, values, state_outs)`` where torch has a part in
        it: the model (not the numpy mlp's ``model_outputs``) or the action head."""
        with torch.inference_mode():
            if model_outputs is None:
                model_out, values, state_outs = self._forward(model_input, states)
            else:
                model_out, values = map(torch.from_numpy, model_outputs)
                state_outs = []
            if self._numpy_sampler is not None:  # on CPU: .numpy() shares the memory
                actions, logp, dist_inputs = self._numpy_sampler.act(
                    model_out.numpy(), mask, explore
                )
                values, *state_outs = [t.numpy() for t in (values, *state_outs)]
                return actions, logp, dist_inputs, values, state_outs
            mask_t = None if mask is None else self._to_device(torch.from_numpy(mask))
            outputs = [
                *self.action_head.act(model_out, mask_t, explore, self._generator),
                values,
                *state_outs,
            ]
            if self._on_cpu:
                actions, logp, dist_inputs, values, *state_outs = [t.numpy() for t in outputs]
            else:
                actions, logp, dist_inputs, values, *state_outs = packed_to_numpy(outputs)
        return actions, logp, dist_inputs, values, state_outs

    def _to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` on the policy's device; on CPU as it is (``.to`` costs a call)."""
        return tensor if self._on_cpu else tensor.to(self.device)

    def _bootstrap_value(self, batch: SampleBatch) -> float:
        """Value of the observation after the trajectory's last row (one forward pass)."""
        last = slice(len(batch["rewards"]) - 1, None)
        next_input = {"obs": batch["new_obs"][last]}
        if self._use_prev_actions:
            next_input["prev_actions"] = batch["actions"][last]
        if self._use_prev_rewards:
            next_input["prev_rewards"] = batch["rewards"][last]
        for i in range(len(self._initial_state)):
            # The state after the last step is the state the next observation is seen with.
            state_out = _required_column(batch, f"state_out_{i}", "GAE bootstraps from it")
            next_input[f"state_in_{i}"] = state_out[last]
        model_input = self._model_input(next_input)
        model_outputs = self._numpy_outputs(model_input)
        if model_outputs is not None:
            return float(model_outputs[1][0])
        with torch.inference_mode():
            _, values, _ = self._forward(model_input, self._state_inputs(next_input))
            return float(values[0])


def _required_column(data: Mapping[str, Any], column: str, why: str) -> Any:
    if column not in data:
        raise ValueError(f"missing input column {column!r} ({why})")
    return data[column]
