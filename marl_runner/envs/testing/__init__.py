"""Small deterministic MultiAgentEnvs for tests and benchmarks.

Each one isolates one thing a runner must get right (dying and spawning
agents, turn-taking rewards, time limits, crashes, masked / dict / box /
multi-discrete spaces) and records in `reward_log` exactly what rewards it
handed out, so reward conservation can be checked end to end.
`play_episode` / `play_vector_env` drive any env with random legal actions.
"""

from marl_runner.envs.testing.cheap_env import CheapEnv
from marl_runner.envs.testing.compare import assert_identical, assert_same
from marl_runner.envs.testing.crashing_env import CrashingEnv, CrashingEnvError
from marl_runner.envs.testing.lifecycle_envs import (
    DyingAgentsEnv,
    NoObsEnv,
    RewardedBeforeAndAfterEnv,
    SpawningAgentsEnv,
    TimeLimitEnv,
    TurnBasedEnv,
)
from marl_runner.envs.testing.malformed_env import MalformedEnv
from marl_runner.envs.testing.pad_spaces import PadSpacesWrapper
from marl_runner.envs.testing.random_play import (
    EpisodeRecord,
    action_mask,
    play_episode,
    play_vector_env,
    random_action,
)
from marl_runner.envs.testing.scripted_env import Round, ScriptedEnv
from marl_runner.envs.testing.space_envs import (
    BoxActionEnv,
    DictObsEnv,
    MaskInfoEnv,
    MultiDiscreteEnv,
)

__all__ = [
    "BoxActionEnv",
    "CheapEnv",
    "CrashingEnv",
    "CrashingEnvError",
    "DictObsEnv",
    "DyingAgentsEnv",
    "RewardedBeforeAndAfterEnv",
    "EpisodeRecord",
    "MalformedEnv",
    "MaskInfoEnv",
    "MultiDiscreteEnv",
    "NoObsEnv",
    "PadSpacesWrapper",
    "Round",
    "ScriptedEnv",
    "SpawningAgentsEnv",
    "TimeLimitEnv",
    "TurnBasedEnv",
    "action_mask",
    "assert_identical",
    "assert_same",
    "play_episode",
    "play_vector_env",
    "random_action",
]
