"""Built-in agent connectors: raw per-agent env data -> policy input."""

from connectors.agent.env_state import ENV_STATE_INFO_KEY, EnvStateAgentConnector
from connectors.agent.flatten import FlattenDataAgentConnector
from connectors.agent.images import GrayscaleAgentConnector, ResizeAgentConnector, is_image_space
from connectors.agent.lambdas import LambdaAgentConnector
from connectors.agent.mean_std_filter import MeanStdObservationFilterAgentConnector, RunningStats
from connectors.agent.obs_preprocessor import ObsPreprocessorConnector
from connectors.agent.rewards import ClipRewardAgentConnector
from connectors.agent.state_buffer import StateBufferConnector
from connectors.agent.view_requirements import ViewRequirementAgentConnector

__all__ = [
    "ENV_STATE_INFO_KEY",
    "ClipRewardAgentConnector",
    "EnvStateAgentConnector",
    "FlattenDataAgentConnector",
    "GrayscaleAgentConnector",
    "LambdaAgentConnector",
    "MeanStdObservationFilterAgentConnector",
    "ObsPreprocessorConnector",
    "ResizeAgentConnector",
    "RunningStats",
    "StateBufferConnector",
    "ViewRequirementAgentConnector",
    "is_image_space",
]
