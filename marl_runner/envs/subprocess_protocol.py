"""What SubprocessVectorEnv and its workers say to each other over a worker's pipe.

Requests are pickled `(command, payload)` tuples: `step` (`[(env_id,
actions), ...]`), `reset` (`[(env_id, seed, options), ...]`), `restart` and
`render` (an env_id), `close`. Every request gets exactly one pickled reply,
in request order, so parent and worker never get out of step. Per sub-env
results are the env's own result (a step's as a list), a `Crash` or a
`Malformed`.

Steps travel through the worker's slot block (`shared_buffers`) when
everything fits: the request is then the one byte `STEP` (actions, which
sub-envs, in which order: all in the block) and the reply the one byte
`DONE` (results and the worker's times in the block). Otherwise a step
request is `("step", (request or None, new_key_sets))` (None: the actions
are in the block) and the reply is pickled as below, a result entry being
None where that sub-env's result is in the block.

A pickled step reply is `(new_block_name, results, resets, new_key_sets, env_s,
busy_s)`: after a step that ended its episode (`"__all__"` terminated or truncated) the worker
resets that sub-env at once, unseeded, and ships the reset result in
`resets` (env_id -> result), saving the parent a round trip; `env_s` is the
time spent inside the envs' `step`/`reset`, `busy_s` the time from reading
the request to sending the reply (pickling it excluded). A reset reply is
`(new_block_name, results)`. Obs dicts of equal-shaped arrays travel through
the worker's shared-memory block (`shared_obs`), named in `new_block_name`
when it changed.
"""

from __future__ import annotations

import pickle
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from marl_runner.envs.errors import EnvError

#: A step request whose actions are all in the worker's slot block.
STEP = b"s"
#: A step reply whose results are all in the worker's slot block.
DONE = b"d"


@dataclass
class Crash:
    """A sub-env raised; `error` is the exception, made picklable."""

    error: Exception


@dataclass
class Malformed:
    """A sub-env returned data that breaks the MultiAgentEnv contract."""

    message: str


def send(conn: Connection, message: Any) -> None:
    conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


def receive(conn: Connection) -> Any:
    return pickle.loads(conn.recv_bytes())


def portable(error: BaseException, where: str) -> Exception:
    """`error` with its traceback text as a note, or an EnvError copy of it if
    it would not survive pickling (the parent never sees the original)."""
    note = f"raised in {where}:\n{''.join(traceback.format_exception(error))}"
    try:
        copy = pickle.loads(pickle.dumps(error))
    except Exception:
        copy = None
    if not isinstance(copy, Exception):
        copy = EnvError(f"{where} raised {type(error).__name__}: {error}")
    try:
        copy.__notes__ = [*getattr(copy, "__notes__", []), note]
    except AttributeError:
        pass  # an exception type that forbids new attributes just loses the note
    return copy
