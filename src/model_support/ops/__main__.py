"""``python -m model_support.ops DEVICE``: this machine's DEVICE stack's coverage of the
operators on stdin (a JSON list), as one JSON line ({"coverage": {op: status}} or {"problem":
sentence}); ``coverage.stack_coverage`` asks it."""

import json
import sys

from .coverage import child

print(json.dumps(child(sys.argv[1], json.loads(sys.stdin.read() or "[]"))))
