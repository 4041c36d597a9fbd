"""Object columns (``infos``) as one JSON text per row, for files that must never unpickle."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import numpy as np


def rows_to_json(column: Iterable[Any], where: str) -> list[str]:
    """Each row of an object column as JSON (``row_to_json``)."""
    return [row_to_json(value, where) for value in column]


def row_to_json(value: Any, where: str) -> str:
    """One row as JSON: numpy values become numbers and lists, tuples lists.

    ``where`` names the column (``policy/infos``) in the error for a row that
    JSON cannot hold.
    """
    # Most rows of `infos`; through the encoder, most of the time a batch file takes to write.
    if type(value) is dict and not value:
        return "{}"
    try:
        return json.dumps(value, default=_json_default)
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"write_batch: a row of {where!r} is not JSON-serialisable: {exc}"
        ) from None


def _json_default(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} {value!r}")
