"""Connectors: the steps between a multi-agent env and its policies.

Agent connectors turn a round's raw per-agent data into policy input; action
connectors turn policy output into env actions. Pipelines chain them, check
that their spaces fit when built, and time each step.
"""

from connectors import action, agent
from connectors.action import *  # noqa: F403  (the built-ins: listed once, in each package's __all__)
from connectors.agent import *  # noqa: F403
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
    BUILTIN_CONNECTORS,
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
    "BUILTIN_CONNECTORS",
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
    "Connector",
    "ConnectorContext",
    "ConnectorError",
    "ConnectorPipeline",
    "ConnectorTiming",
    "build_connectors",
    "build_pipeline",
    "default_action_connectors",
    "default_agent_connectors",
    "get_connector",
    "register_connector",
    "register_lambda_action_connector",
    "register_lambda_agent_connector",
    "registered_names",
]
__all__ += agent.__all__
__all__ += action.__all__
