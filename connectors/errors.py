"""The one error type of the connectors package."""


class ConnectorError(ValueError):
    """A connector, pipeline or connector spec that cannot work as given."""
