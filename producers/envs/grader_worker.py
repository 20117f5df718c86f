"""The math grader's child process (see `producers.envs.grader`): reads one JSON request a
line from stdin, writes `true` or `false` a line to stdout, until stdin closes.

The grading is GEM's (gem-llm 0.0.4 `MathEnv.check_correct`): math-verify parses the answer
once and each gold answer, and the answer is right when `verify(gold, answer)` holds for one.
"""

from __future__ import annotations

import json
import logging
import sys


def main() -> int:
    from math_verify import parse, verify

    logging.disable(logging.CRITICAL)  # math-verify warns on every odd answer: stderr stays quiet

    out = sys.stdout
    out.write('"ready"\n')
    out.flush()
    for line in sys.stdin:
        request = json.loads(line)
        try:
            answer = parse(request["answer"])
            right = any(verify(parse(str(gold)), answer) for gold in request["gold"])
        except Exception:  # noqa: BLE001 - math-verify on odd input: counted wrong, as in GEM
            right = False
        out.write("true\n" if right else "false\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
