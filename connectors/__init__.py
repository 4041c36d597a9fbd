"""Connectors: the steps between a multi-agent env and its policies.

Agent connectors turn a round's raw per-agent data into policy input; action
connectors turn policy output into env actions. Pipelines chain them, check
that their spaces fit when built, and time each step.
"""

from connectors.action import (
    ClipActionsConnector,
    ConvertToNumpyConnector,
    ImmutableActionsConnector,
    LambdaActionConnector,
    NormalizeActionsConnector,
)
from connectors.agent import (
    ClipRewardAgentConnector,
    FlattenDataAgentConnector,
    GrayscaleAgentConnector,
    LambdaAgentConnector,
    MeanStdObservationFilterAgentConnector,
    ObsPreprocessorConnector,
    ResizeAgentConnector,
    RunningStats,
    StateBufferConnector,
    ViewRequirementAgentConnector,
    is_image_space,
)
from connectors.base import ActionConnector, AgentConnector, Connector, ConnectorContext
from connectors.data import (
    META_COLUMNS,
    ActionConnectorDataType,
    ActionRows,
    AgentConnectorDataType,
    AgentConnectorsOutput,
    AgentRows,
)
from connectors.errors import ConnectorError
from connectors.pipeline import (
    ActionConnectorPipeline,
    AgentConnectorPipeline,
    ConnectorPipeline,
    ConnectorTiming,
    build_pipeline,
)
from connectors.registry import (
    build_connectors,
    default_action_connectors,
    default_agent_connectors,
    get_connector,
    register_connector,
    register_lambda_action_connector,
    register_lambda_agent_connector,
    registered_names,
)

__all__ = [
    "META_COLUMNS",
    "ActionConnector",
    "ActionConnectorDataType",
    "ActionConnectorPipeline",
    "ActionRows",
    "AgentConnector",
    "AgentConnectorDataType",
    "AgentConnectorPipeline",
    "AgentConnectorsOutput",
    "AgentRows",
    "ClipActionsConnector",
    "ClipRewardAgentConnector",
    "Connector",
    "ConnectorContext",
    "ConnectorError",
    "ConnectorPipeline",
    "ConnectorTiming",
    "ConvertToNumpyConnector",
    "FlattenDataAgentConnector",
    "GrayscaleAgentConnector",
    "ImmutableActionsConnector",
    "LambdaActionConnector",
    "LambdaAgentConnector",
    "MeanStdObservationFilterAgentConnector",
    "NormalizeActionsConnector",
    "ObsPreprocessorConnector",
    "ResizeAgentConnector",
    "RunningStats",
    "StateBufferConnector",
    "ViewRequirementAgentConnector",
    "build_connectors",
    "build_pipeline",
    "default_action_connectors",
    "default_agent_connectors",
    "get_connector",
    "is_image_space",
    "register_connector",
    "register_lambda_action_connector",
    "register_lambda_agent_connector",
    "registered_names",
]
