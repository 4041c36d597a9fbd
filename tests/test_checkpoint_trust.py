"""Restoring a checkpoint imports nothing the file names unless the caller opts in."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from helpers_runner_connectors import one_torch_thread  # noqa: F401 (a fixture)

from marl_runner import EnvRunner, RunnerConfig
from marl_runner.checkpoint import (
    CheckpointError,
    checkpoint_config,
    load_checkpoint,
    restore_checkpoint,
    save_checkpoint,
    write_checkpoint,
)
from marl_runner.envs import register_env
from tests.envs import CheapEnv

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CHEAP = "marl_runner.bench.envs:CheapEnv"
MAPPING = "examples.mappings:shared"
LAMBDA_FN = "helpers_runner_connectors:double_rewards"
TAG_ROWS = "helpers_runner_connectors:TagRowsConnector"


def cheap_config(**changes: Any) -> dict[str, Any]:
    """Two CheapEnv agents on one shared policy; ``changes`` replace top-level keys."""
    return {
        "env": {"name": "ckpt-trust-cheap", "config": {"num_agents": 2, "episode_len": 5}},
        "rollout_fragment_length": 5,
        "policies": {"shared": {"model": {"type": "mlp", "hidden": [4]}}},
        **changes,
    }


register_env("ckpt-trust-cheap", lambda cfg: CheapEnv(**cfg))


def saved(tmp_path: Path, data: dict[str, Any], name: str = "runner.ckpt") -> Path:
    with EnvRunner(RunnerConfig.from_dict(data)) as runner:
        runner.sample()
        return save_checkpoint(runner, tmp_path / name)


def edited(path: Path, edit: Any) -> Path:
    """The checkpoint at ``path`` with ``edit(payload)`` applied: what anyone can write."""
    payload = load_checkpoint(path)
    edit(payload)
    return write_checkpoint(payload, path)


def test_registered_and_builtin_names_restore_by_default(tmp_path):
    path = saved(tmp_path, cheap_config())
    with restore_checkpoint(path) as restored:
        assert restored.sample().env_steps() == 5
    # RandomPolicy and a glob mapping are data too.
    data = cheap_config(policy_mapping_fn={"agent_*": "shared"})
    data["policies"]["shared"]["policy_class"] = "RandomPolicy"
    with restore_checkpoint(saved(tmp_path, data, "random.ckpt")) as restored:
        assert type(restored.policy_map["shared"]).__name__ == "RandomPolicy"


def test_an_env_name_running_os_system_is_refused(tmp_path):
    """The finding: env.name 'os:system' ran `os.system(command=...)` during restore."""
    marker = tmp_path / "pwned"
    path = edited(
        saved(tmp_path, cheap_config()),
        lambda p: p["config"].update(
            env={"name": "os:system", "config": {"command": f"touch {marker}"}}
        ),
    )
    with pytest.raises(CheckpointError) as err:
        restore_checkpoint(path)
    message = str(err.value)
    for part in (str(path), "config.env.name", "'os:system'", "trusted=True", "['os:system']"):
        assert part in message
    assert not marker.exists()


@pytest.mark.parametrize(
    ("key", "edit"),
    [
        ("config.callbacks", lambda c: c.update(callbacks="subprocess:getoutput")),
        ("config.policy_mapping_fn", lambda c: c.update(policy_mapping_fn="os.system")),
        (
            "config.policies.shared.policy_class",
            lambda c: c["policies"]["shared"].update(policy_class="os:system"),
        ),
        (
            "config.policies.shared.model.class",
            lambda c: c["policies"]["shared"].update(model={"class": "os:system"}),
        ),
        (
            "config.policies.shared.agent_connectors[1]",
            lambda c: c["policies"]["shared"].update(
                agent_connectors=["ObsPreprocessorConnector", "os:system"]
            ),
        ),
        (
            "config.policies.shared.action_connectors[0].fn",
            lambda c: c["policies"]["shared"].update(
                action_connectors=[{"name": "LambdaActionConnector", "fn": "os:system"}]
            ),
        ),
        ("config.env.name", lambda c: c["env"].update(name=CHEAP)),
    ],
)
def test_every_config_key_that_imports_is_refused(tmp_path, key, edit):
    path = edited(saved(tmp_path, cheap_config()), lambda p: edit(p["config"]))
    with pytest.raises(CheckpointError, match=re.escape(f"{path.name}: checkpoint field {key} ")):
        restore_checkpoint(path)


@pytest.mark.parametrize("kind", ["agent_connectors", "action_connectors"])
def test_import_paths_in_the_connector_state_are_refused(tmp_path, kind):
    def edit(payload):
        payload["policies"]["shared"][kind] = [("LambdaAgentConnector", {"fn": "os:system"})]

    path = edited(saved(tmp_path, cheap_config()), edit)
    with pytest.raises(CheckpointError, match=rf"policies\.shared\.{kind}\[0\]\.fn names"):
        restore_checkpoint(path)
    edited(path, lambda p: p["policies"]["shared"].update({kind: [("os:x", {})]}))
    with pytest.raises(CheckpointError, match=rf"{kind}\[0\] names the import path 'os:x'"):
        restore_checkpoint(path)


def test_trusted_allow_and_own_config_each_opt_in(tmp_path):
    data = cheap_config(
        env={"name": CHEAP, "config": {"num_agents": 2, "episode_len": 5}},
        policy_mapping_fn=MAPPING,
    )
    data["policies"]["shared"]["agent_connectors"] = [
        "ObsPreprocessorConnector",
        {"name": "LambdaAgentConnector", "fn": LAMBDA_FN},
    ]
    path = saved(tmp_path, data)
    with pytest.raises(CheckpointError) as err:
        restore_checkpoint(path)
    assert f"allow=['{CHEAP}', '{MAPPING}', '{LAMBDA_FN}']" in str(err.value)
    with pytest.raises(CheckpointError, match=LAMBDA_FN):
        restore_checkpoint(path, allow=[CHEAP, MAPPING])  # one left
    with restore_checkpoint(path, allow=[CHEAP, MAPPING, LAMBDA_FN]) as restored:
        assert restored.sample().env_steps() == 5
    with restore_checkpoint(path, trusted=True) as restored:
        assert restored.config.policy_mapping_fn == MAPPING
    # The caller's config: its import paths are the caller's, the file gives weights and state.
    with restore_checkpoint(path, config=data) as restored:
        assert restored.config.env["name"] == CHEAP
    with pytest.raises(TypeError, match="allow: got the string"):
        restore_checkpoint(path, allow=CHEAP)


def test_own_config_still_refuses_other_paths_in_the_connector_state(tmp_path):
    path = saved(tmp_path, cheap_config())
    edited(path, lambda p: p["policies"]["shared"].update(agent_connectors=[(TAG_ROWS, {})]))
    with pytest.raises(CheckpointError, match=r"agent_connectors\[0\] names"):
        restore_checkpoint(path, config=cheap_config())
    mine = cheap_config()
    mine["policies"]["shared"]["agent_connectors"] = [TAG_ROWS]
    with restore_checkpoint(path, config=mine) as restored:  # the caller names it too
        assert restored.sample().env_steps() == 5


def test_overrides_are_the_callers_and_may_replace_a_refused_path(tmp_path):
    path = saved(tmp_path, cheap_config(policy_mapping_fn=MAPPING), "mapped.ckpt")
    with pytest.raises(CheckpointError, match="config.policy_mapping_fn"):
        restore_checkpoint(path)
    with restore_checkpoint(path, overrides=["policy_mapping_fn={agent_*: shared}"]) as restored:
        assert restored.config.policy_mapping_fn == {"agent_*": "shared"}
    plain = saved(tmp_path, cheap_config(), "plain.ckpt")
    with restore_checkpoint(plain, overrides=[f"policy_mapping_fn={MAPPING}"]) as restored:
        assert restored.config.policy_mapping_fn == MAPPING


def test_checkpoint_config_checks_like_restore_and_builds_nothing(tmp_path):
    path = saved(tmp_path, cheap_config(policy_mapping_fn=MAPPING), "mapped.ckpt")
    with pytest.raises(CheckpointError, match="config.policy_mapping_fn"):
        checkpoint_config(path)
    config = checkpoint_config(path, allow=[MAPPING], overrides=["num_envs=3"])
    assert config.num_envs == 3 and config.policy_mapping_fn == MAPPING
    with restore_checkpoint(path, config=config) as restored:  # handed back as the caller's
        assert restored.config.num_envs == 3
