"""The ``vectorize`` modes: the one list, owned by the vector-env factory.

Its own tiny module so that ``marl_runner.config`` can check the key without
importing the vector envs themselves.
"""

#: How sub-envs are stepped: in this process, in worker processes, as Ray
#: actors, or driven from outside (inverted control).
VECTORIZE_MODES = ("sync", "subprocess", "ray", "external")
