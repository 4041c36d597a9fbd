"""examples/train_ppo.py --device: learners on that device, the sampler where its config puts it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from examples import train_ppo
from marl_runner import EnvRunner

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")


def smoke_args(*extra: str) -> object:
    return train_ppo.parse_args(["--smoke", *extra])


def test_device_defaults_to_cpu_and_rejects_unknown_names(capsys: pytest.CaptureFixture) -> None:
    assert smoke_args().device == "cpu"
    with pytest.raises(SystemExit):
        smoke_args("--device", "tpu7")
    assert "--device tpu7: unknown policy device 'tpu7'" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_cuda_without_cuda_is_a_usage_error(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        smoke_args("--device", "cuda")
    assert "CUDA is not available" in capsys.readouterr().err
    assert smoke_args("--device", "auto").device == "cpu"


def learners_and_runner(device: str) -> tuple[dict, EnvRunner]:
    args = smoke_args("--device", device)
    runner = EnvRunner(train_ppo.make_config(args))
    learners, optimizers = train_ppo.make_learners(runner, args)
    assert set(optimizers) == set(learners) == {"shared"}
    return learners, runner


def one_update_moves_weights_back(learners: dict, runner: EnvRunner) -> None:
    """One PPO update on the learner's device; the sampler gets CPU arrays and stays put."""
    args = smoke_args()
    batch = runner.sample().policy_batches["shared"]
    learner = learners["shared"]
    optimizer = torch.optim.Adam(learner.parameters(), lr=1e-3)
    stats = train_ppo.ppo_update(learner, optimizer, batch, args, np.random.default_rng(0))
    assert all(np.isfinite(stats[key]) for key in train_ppo.STAT_KEYS[:-1])
    weights = learner.get_weights()
    assert all(isinstance(w, np.ndarray) for w in weights.values())
    runner.set_weights({"shared": weights})
    sampler_policy = runner.policy_map["shared"]
    assert sampler_policy.device.type == "cpu"
    for name, value in sampler_policy.get_weights().items():
        np.testing.assert_array_equal(value, weights[name])
    runner.sample()  # the sampler still samples on its own device


def test_learners_train_on_the_cpu_and_hand_back_cpu_weights() -> None:
    learners, runner = learners_and_runner("cpu")
    with runner:
        assert learners["shared"].device == torch.device("cpu")
        assert learners["shared"] is not runner.policy_map["shared"]
        one_update_moves_weights_back(learners, runner)


@CUDA
def test_learners_train_on_cuda_while_sampling_stays_on_the_cpu() -> None:
    learners, runner = learners_and_runner("cuda")
    with runner:
        learner = learners["shared"]
        assert learner.device.type == "cuda"
        assert all(p.device.type == "cuda" for p in learner.parameters())
        one_update_moves_weights_back(learners, runner)


@CUDA
def test_train_ppo_smoke_on_cuda(tmp_path: object) -> None:
    summary = train_ppo.main(["--smoke", "--device", "cuda", "--run-dir", str(tmp_path)])
    assert summary["iterations"] == 3
