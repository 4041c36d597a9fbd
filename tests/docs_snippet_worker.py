"""Runs the ```python blocks of README.md and docs/*.md for tests/test_docs_snippets.py.

One process runs every block it is sent, so torch and marl_runner are imported
once. Blocks of one page share one `__main__` namespace, in page order, as a
reader running the page top to bottom would (a block may use what an earlier
block of its page defined); a new page starts a fresh one. Each request is a
JSON line on stdin: `{"page", "code", "cwd", "script"}` (`script`: the file
the page's code is saved as, so `"__main__:MyEnv"` names resolve in env worker
processes too). Each answer is a JSON line `{"error": None | traceback}` on the
process's original stdout; everything the blocks print goes to stderr.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
import types


def main() -> None:
    answers = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # block output, and that of processes they start, away from the answers
    page = None
    module = None
    for line in sys.stdin:
        request = json.loads(line)
        if request["page"] != page:
            page = request["page"]
            module = types.ModuleType("__main__")
            module.__file__ = request["script"]
            sys.modules["__main__"] = module
            os.chdir(request["cwd"])
            if request["cwd"] not in sys.path:
                sys.path.insert(0, request["cwd"])
        with open(request["script"], "a", encoding="utf-8") as script:
            script.write(request["code"] + "\n")
        try:
            exec(compile(request["code"], request["name"], "exec"), module.__dict__)
            error = None
        except BaseException:  # noqa: BLE001 - reported to the test, which fails on it
            error = traceback.format_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        answers.write(json.dumps({"error": error}) + "\n")
        answers.flush()


if __name__ == "__main__":
    main()
