"""``marl_runner.client.PolicyClient``: the public path of the serving client.

The client lives with the server it talks to, in ``marl_runner.serving.client``;
this module keeps the import path users and their simulators already use.
"""

from marl_runner.serving.client import PolicyClient, PolicyServerError, PolicyServerUnavailable

__all__ = ["PolicyClient", "PolicyServerError", "PolicyServerUnavailable"]
