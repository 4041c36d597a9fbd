"""Built-in action connectors: policy output -> env actions."""

from connectors.action.bounds import ClipActionsConnector, NormalizeActionsConnector
from connectors.action.convert import ConvertToNumpyConnector
from connectors.action.immutable import ImmutableActionsConnector
from connectors.action.lambdas import LambdaActionConnector

__all__ = [
    "ClipActionsConnector",
    "ConvertToNumpyConnector",
    "ImmutableActionsConnector",
    "LambdaActionConnector",
    "NormalizeActionsConnector",
]
