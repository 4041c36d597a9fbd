"""Small deterministic MultiAgentEnvs for tests (the package `tests.envs`).

Each one isolates one thing a runner must get right (dying and spawning
agents, turn-taking rewards, time limits, crashes, masked / dict / box /
multi-discrete spaces) and records in `reward_log` exactly what rewards it
handed out, so reward conservation can be checked end to end.
`play_episode` / `play_vector_env` drive any env with random legal actions.
The envs a bench command runs ship in `marl_runner.bench.envs` and are
re-exported here, so a test names every env through one package. Worker
processes import this package too: tests/conftest.py puts the checkout on
their PYTHONPATH.
"""

from marl_runner.bench.envs import CheapEnv, CrashingEnvError, RandomFaultEnv, Round, ScriptedEnv
from tests.envs.compare import assert_identical, assert_same
from tests.envs.crashing_env import CrashingEnv
from tests.envs.lifecycle_envs import (
    AgentIdsEnv,
    DyingAgentsEnv,
    NeverEndingOnEvenSeedsEnv,
    NoObsEnv,
    ReturningAgentEnv,
    ReusedArraysEnv,
    RewardedBeforeAndAfterEnv,
    SpawningAgentsEnv,
    TimeLimitEnv,
    TurnBasedEnv,
)
from tests.envs.malformed_env import MalformedEnv
from tests.envs.pad_spaces import PadSpacesWrapper
from tests.envs.random_play import (
    EpisodeRecord,
    action_mask,
    play_episode,
    play_vector_env,
    random_action,
)
from tests.envs.space_envs import (
    BoxActionEnv,
    DictObsEnv,
    ListPairActionEnv,
    MaskInfoEnv,
    MultiDiscreteEnv,
    TupleActionEnv,
)

__all__ = [
    "AgentIdsEnv",
    "BoxActionEnv",
    "CheapEnv",
    "CrashingEnv",
    "CrashingEnvError",
    "DictObsEnv",
    "DyingAgentsEnv",
    "RewardedBeforeAndAfterEnv",
    "EpisodeRecord",
    "MalformedEnv",
    "ListPairActionEnv",
    "MaskInfoEnv",
    "MultiDiscreteEnv",
    "NeverEndingOnEvenSeedsEnv",
    "NoObsEnv",
    "PadSpacesWrapper",
    "RandomFaultEnv",
    "ReturningAgentEnv",
    "ReusedArraysEnv",
    "Round",
    "ScriptedEnv",
    "SpawningAgentsEnv",
    "TimeLimitEnv",
    "TupleActionEnv",
    "TurnBasedEnv",
    "action_mask",
    "assert_identical",
    "assert_same",
    "play_episode",
    "play_vector_env",
    "random_action",
]
