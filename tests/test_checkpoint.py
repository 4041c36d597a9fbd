"""Checkpoints: a runner's config, weights and connector state in one file, and back."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
from helpers_runner_connectors import (
    KAZ_MAPPING,
    assert_same_policies,
    config,
    filter_of,
    filtered_kaz_config,
    kaz,
    one_torch_thread,  # noqa: F401 (a fixture)
    perturbed_weights,
)

from marl_runner import EnvRunner, TorchPolicy
from marl_runner.checkpoint import (
    FORMAT_NAME,
    FORMAT_VERSION,
    CheckpointError,
    load_checkpoint,
    restore_checkpoint,
    save_checkpoint,
    write_checkpoint,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def archer_actions(runner: EnvRunner, num_rows: int = 5) -> np.ndarray:
    """The archer policy's sampled actions for a fixed input (draws from its generator)."""
    policy = runner.policy_map["archer"]
    inputs = {"obs": np.random.default_rng(1).normal(size=(num_rows, 135)).astype(np.float32)}
    for i, state in enumerate(policy.get_initial_state()):
        inputs[f"state_in_{i}"] = np.stack([state] * num_rows)
    return policy.compute_actions_from_input_dict(inputs, explore=True)[0]


def test_save_and_restore_round_trip(tmp_path):
    path = tmp_path / "ckpt" / "runner.pkl"
    with EnvRunner(filtered_kaz_config(seed=11)) as runner:
        runner.set_weights(perturbed_weights(runner))
        runner.sample()
        assert filter_of(runner, "archer").get_state()["count"] > 0
        assert save_checkpoint(runner, path) == path
        assert os.listdir(path.parent) == ["runner.pkl"]  # one file, no temp file left
        payload = load_checkpoint(path)
        assert (payload["format"], payload["version"]) == (FORMAT_NAME, FORMAT_VERSION)
        assert payload["config"] == runner.config.to_dict()
        assert set(payload["policies"]) == {"archer", "knight"}
        with restore_checkpoint(path) as restored:
            assert restored.config.to_dict() == runner.config.to_dict()
            assert_same_policies(runner, restored)
            # The policies' sampling generators come back too: same input, same actions.
            np.testing.assert_array_equal(archer_actions(restored), archer_actions(runner))
            batch = restored.sample()
            assert len(batch.policy_batches["knight"]) > 0
            assert (
                filter_of(restored, "knight").get_state()["count"]
                > filter_of(runner, "knight").get_state()["count"]
            )  # restored filters go on learning from where they were


class MyRunner(EnvRunner):
    pass


def test_restore_with_config_overrides_and_a_runner_subclass(tmp_path):
    path = tmp_path / "runner.pkl"
    with EnvRunner(filtered_kaz_config()) as runner:
        runner.sample()
        save_checkpoint(runner, path)
        overrides = ["num_envs=1", "rollout_fragment_length=4"]
        with restore_checkpoint(path, overrides=overrides, runner_cls=MyRunner) as small:
            assert type(small) is MyRunner
            assert small.config.num_envs == 1 and small.config.rollout_fragment_length == 4
            assert_same_policies(runner, small)
            assert small.sample().env_steps() == 4


def test_saving_again_replaces_the_checkpoint_atomically(tmp_path, monkeypatch):
    path = tmp_path / "runner.pkl"
    with EnvRunner(filtered_kaz_config()) as runner:
        save_checkpoint(runner, path)
        first = path.read_bytes()
        runner.sample()
        save_checkpoint(runner, path)  # overwriting is fine
        second = path.read_bytes()
        assert second != first

        def crash(source, target):  # interrupted after the temp file is written in full
            assert load_checkpoint(source) and Path(source).read_bytes() != second
            raise KeyboardInterrupt

        monkeypatch.setattr(os, "replace", crash)
        runner.sample()
        with pytest.raises(KeyboardInterrupt):
            save_checkpoint(runner, path)
    assert path.read_bytes() == second  # the old checkpoint is intact
    assert os.listdir(tmp_path) == ["runner.pkl"]  # and the temp file is gone


def test_ready_made_policies_and_mapping_fn_are_passed_again(tmp_path):
    path = tmp_path / "runner.pkl"

    def mapping(agent_id, episode, **kwargs):
        return "archer" if agent_id.startswith("archer") else "knight"

    def ready_archer():
        obs_space, action_space = spaces["archer"]
        return TorchPolicy(obs_space, action_space, {"model": {"type": "mlp", "hidden": [8]}})

    cfg = config(kaz(), {"archer": {}, "knight": {"model": {"type": "mlp", "hidden": [8]}}})
    with EnvRunner(cfg, policy_mapping_fn=mapping) as probe:
        spaces = probe.get_spaces()
    with EnvRunner(cfg, policies={"archer": ready_archer()}, policy_mapping_fn=mapping) as runner:
        runner.set_weights(perturbed_weights(runner))
        runner.sample()
        save_checkpoint(runner, path)
        with pytest.raises(ValueError, match="policy_mapping_fn"):
            restore_checkpoint(path, policies={"archer": ready_archer()})  # nor the mapping
        with pytest.raises(CheckpointError, match=r"'archer' \(\{'type': 'mlp'\}\)"):
            restore_checkpoint(path)  # the config's archer model is not the one saved
        fresh_archer = ready_archer()
        with restore_checkpoint(
            path, policies={"archer": fresh_archer}, policy_mapping_fn=mapping
        ) as restored:
            assert restored.policy_map["archer"] is fresh_archer
            assert_same_policies(runner, restored)


def test_a_checkpointed_policy_the_runner_lacks_is_an_error(tmp_path):
    path = tmp_path / "runner.pkl"
    cfg = config(kaz(), {"archer": {}, "knight": {}}, policy_mapping_fn=KAZ_MAPPING)
    with EnvRunner(cfg) as runner:
        save_checkpoint(runner, path)
    payload = load_checkpoint(path)
    payload["policies"]["zombie"] = payload["policies"]["knight"]
    write_checkpoint(payload, path)
    with pytest.raises(CheckpointError, match=r"no policies \['zombie'\]"):
        restore_checkpoint(path)


def test_a_mapping_override_that_leaves_a_saved_policy_without_agents_restores(
    tmp_path, caplog
):
    """Every agent mapped to archer: knight is never built. Its saved state is skipped,
    with a warning naming it, instead of the restore being refused."""
    path = tmp_path / "runner.pkl"
    with EnvRunner(filtered_kaz_config(seed=11)) as runner:
        runner.set_weights(perturbed_weights(runner))
        save_checkpoint(runner, path)
        archer = runner.policy_map["archer"].get_weights()
    with restore_checkpoint(path, overrides=['policy_mapping_fn={"*": "archer"}']) as restored:
        assert sorted(restored.policy_map) == ["archer"]
        for name, value in restored.policy_map["archer"].get_weights().items():
            np.testing.assert_array_equal(value, archer[name])
        assert restored.sample().env_steps() > 0
    assert "no agent maps to policies ['knight']" in caplog.text


def test_files_that_are_not_checkpoints_are_rejected(tmp_path):
    with pytest.raises(CheckpointError, match="cannot read"):
        restore_checkpoint(tmp_path / "missing.pkl")
    garbage = tmp_path / "garbage.pkl"
    garbage.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match=r"garbage.pkl is not a marl-runner checkpoint"):
        load_checkpoint(garbage)
    old_pickle = tmp_path / "old.pkl"
    old_pickle.write_bytes(pickle.dumps({"format": FORMAT_NAME, "version": 1}))
    with pytest.raises(CheckpointError, match=r"old.pkl is a pickle .*not loaded"):
        load_checkpoint(old_pickle)


class Payload:
    """Creates a marker file when unpickled: a checkpoint must never do that."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_crafted_pickle_payload_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.ckpt"
    evil.write_bytes(pickle.dumps({"format": FORMAT_NAME, "x": Payload(str(marker))}))
    with pytest.raises(CheckpointError):
        restore_checkpoint(evil)
    # The same payload behind a valid header and checksum: still only JSON and raw bytes.
    header = json.dumps({"format": FORMAT_NAME, "version": FORMAT_VERSION}).encode()
    body = struct.pack("<8sIQ", b"MARLCKPT", FORMAT_VERSION, len(header)) + header
    body += pickle.dumps(Payload(str(marker)))
    evil.write_bytes(body + hashlib.sha256(body).digest())
    with pytest.raises(CheckpointError, match="header has no 'config' field"):
        restore_checkpoint(evil)
    assert not marker.exists()


@pytest.fixture(scope="module")
def saved_checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt") / "runner.ckpt"
    with EnvRunner(filtered_kaz_config(seed=2)) as runner:
        runner.sample()
        save_checkpoint(runner, path)
    return path


def test_every_flipped_byte_is_detected(saved_checkpoint, tmp_path):
    data = saved_checkpoint.read_bytes()
    rng = np.random.default_rng(0)
    positions = {0, 8, 12, 20, len(data) // 2, len(data) - 33, len(data) - 1}
    positions |= set(rng.integers(0, len(data), 200).tolist())
    corrupt = tmp_path / "corrupt.ckpt"
    for position in sorted(positions):
        flipped = bytearray(data)
        flipped[position] ^= 1 << int(rng.integers(8))
        corrupt.write_bytes(bytes(flipped))
        with pytest.raises(CheckpointError, match="corrupt.ckpt"):
            load_checkpoint(corrupt)
    for start in rng.integers(0, len(data) - 8, 20).tolist():  # 8 random bytes at once
        changed = bytearray(data)
        changed[start : start + 8] = rng.integers(0, 256, 8, dtype=np.uint8).tobytes()
        if bytes(changed) == data:
            continue
        corrupt.write_bytes(bytes(changed))
        with pytest.raises(CheckpointError, match="corrupt.ckpt"):
            load_checkpoint(corrupt)


def test_truncated_and_wrong_version_files_are_rejected(saved_checkpoint, tmp_path):
    data = saved_checkpoint.read_bytes()
    short = tmp_path / "short.ckpt"
    for length in (0, 5, 20, 40, len(data) // 2, len(data) - 1):
        short.write_bytes(data[:length])
        with pytest.raises(CheckpointError, match="short.ckpt"):
            load_checkpoint(short)
    payload = load_checkpoint(saved_checkpoint)
    newer = tmp_path / "newer.ckpt"
    body = bytearray(data[:-32])
    body[8:12] = (FORMAT_VERSION + 1).to_bytes(4, "little")
    newer.write_bytes(bytes(body) + hashlib.sha256(bytes(body)).digest())
    with pytest.raises(CheckpointError, match=r"newer.ckpt: checkpoint version 3 is not supported"):
        load_checkpoint(newer)
    assert payload["version"] == FORMAT_VERSION


def test_the_file_holds_json_and_raw_arrays_only(saved_checkpoint):
    data = saved_checkpoint.read_bytes()
    assert data.startswith(b"MARLCKPT") and b"\x80\x05" not in data[:20]
    payload = load_checkpoint(saved_checkpoint)
    weights = payload["policies"]["archer"]["weights"]
    assert all(type(w) is np.ndarray and w.flags.writeable for w in weights.values())
