"""Build the API reference from the docstrings with pdoc; fail on any pdoc warning.

    python scripts/build_api_docs.py [OUT_DIR]        # default: build/api (git-ignored)

Then open OUT_DIR/index.html. The reference covers the modules users import
(README.md and docs/ name no others); a package's `__all__` limits what pdoc
shows of it, so its public submodules are listed here one by one.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "build" / "api"
PUBLIC_MODULES = (
    "marl_runner",
    "marl_runner.envs",
    "marl_runner.distributed",
    "marl_runner.policy",
    "marl_runner.policy.sequences",
    "marl_runner.io",
    "marl_runner.client",
    "marl_runner.metrics_log",
    "connectors",
)
_ANNOTATION_OF = re.compile(r"Error parsing type annotation .* for ([\w.]+)\.__init__\b")


def build(out_dir: Path) -> list[str]:
    """Write the reference into `out_dir`; returns pdoc's warnings (empty when clean)."""
    import pdoc
    import pdoc.render

    pdoc.render.configure(docformat="google", show_source=False)
    pdoc_dir = str(Path(pdoc.__file__).parent)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pdoc.pdoc(*PUBLIC_MODULES, output_directory=out_dir)
    messages = [str(w.message) for w in caught if w.filename.startswith(pdoc_dir)]
    return [message for message in messages if not _is_named_tuple_constructor(message)]


def _is_named_tuple_constructor(message: str) -> bool:
    """pdoc resolves the annotations of a NamedTuple's generated `__new__` in an empty
    namespace (its `__module__` is not a real module), so with postponed annotations
    every non-builtin name there fails; the docs show the annotation as written."""
    match = _ANNOTATION_OF.search(message)
    if match is None:
        return False
    module_name, _, class_name = match.group(1).rpartition(".")
    cls = getattr(importlib.import_module(module_name), class_name, None)
    return isinstance(cls, type) and issubclass(cls, tuple) and hasattr(cls, "_fields")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", nargs="?", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    problems = build(args.out_dir)
    for problem in problems:
        print(f"pdoc warning: {problem}", file=sys.stderr)
    if problems:
        print(f"API reference: {len(problems)} warning(s), see above", file=sys.stderr)
        return 1
    print(f"API reference: {args.out_dir / 'index.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
