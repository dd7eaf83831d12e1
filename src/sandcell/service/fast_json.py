"""A JSON response for the bodies on every run's path, encoded by orjson where it is installed.

A run's result is already plain JSON data (``result_to_dict``), so it is encoded once, without
pydantic validating it again; orjson does that about twenty times faster than the standard
library. It is optional (not a dependency of the service): without it, or for data it refuses
(an integer beyond 64 bits), the standard library encodes the same JSON.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from starlette.responses import JSONResponse

__all__ = ["FastJSONResponse"]

_orjson_dumps: Callable[[Any], bytes] | None
try:
    from orjson import dumps as _orjson_dumps
except ImportError:  # depends on the installation
    _orjson_dumps = None


class FastJSONResponse(JSONResponse):
    def render(self, content: Any) -> bytes:
        if _orjson_dumps is not None:
            try:
                return _orjson_dumps(content)
            except TypeError:
                pass  # what orjson cannot encode, the standard library may
        return json.dumps(
            content, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")
        ).encode("utf-8")
