"""Sampled batches on disk: ``.npz`` batch files or Parquet episode tables, read back exactly.

``write_batch`` / ``read_batches`` are the whole interface; ``batch_files``
holds the ``.npz`` form and the format dispatch, ``parquet`` the episode
tables (pyarrow, an optional extra, imported on first use; docs/DATA.md).
"""

from marl_runner.io.batch_files import (
    FORMATS,
    batch_path,
    list_batch_files,
    read_batch,
    read_batches,
    write_batch,
)

__all__ = ["FORMATS", "batch_path", "list_batch_files", "read_batch", "read_batches", "write_batch"]
