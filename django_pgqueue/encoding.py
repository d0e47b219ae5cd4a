"""How the queue writes JSON: the one encoder for payloads and results.

Compact (no spaces), UTF-8 text rather than \\u escapes, and no NaN or Infinity, which
are not JSON and which jsonb refuses. Raises TypeError for values JSON cannot hold and
ValueError for NaN/Infinity, like `json.dumps`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

dumps: Callable[[Any], str] = json.JSONEncoder(
    ensure_ascii=False, allow_nan=False, separators=(",", ":")
).encode
