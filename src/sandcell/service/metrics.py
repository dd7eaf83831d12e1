"""Prometheus metrics of the service, in the text exposition format (version 0.0.4).

Written by hand: a handful of counters, one histogram and a few gauges do not need a client
library, and the gauges are read from the live objects when scraped rather than kept in step.
"""

from __future__ import annotations

import hmac
import threading
from collections.abc import Callable, Iterable, Mapping

from starlette.requests import Request

from sandcell.service.local_owner import PEER_UID
from sandcell.service.problems import ServiceProblem
from sandcell.service.server import is_loopback
from sandcell.service.tenants import hash_key

__all__ = ["LATENCY_BUCKETS_S", "Metrics", "check_metrics_access"]

LATENCY_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def check_metrics_access(request: Request, key_sha256: str | None) -> None:
    """Refuse a scrape that is not the operator's: 401 without the metrics key where the
    service has one; else 403 from an address that is not loopback (the local socket is the
    service's own user)."""
    if key_sha256 is not None:
        sent = request.headers.get("authorization", "")
        scheme, _, key = sent.partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(hash_key(key.strip()), key_sha256):
            return
        raise ServiceProblem(
            401,
            "/metrics needs the service's metrics key (sandcell serve --metrics-key-file) as "
            "'Authorization: Bearer KEY'",
            headers={"WWW-Authenticate": 'Bearer realm="sandcell-metrics"'},
        )
    if isinstance(request.scope.get("state", {}).get(PEER_UID), int):
        return
    client = request.client.host if request.client is not None else ""
    if not is_loopback(client):
        raise ServiceProblem(
            403,
            f"/metrics answers loopback addresses only, not {client or 'this client'}; scrape "
            "it on the host, or start the service with --metrics-key-file to let a scraper "
            "that sends the key in",
        )


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _num(value: float) -> str:
    return repr(float(value)) if value != int(value) else str(int(value))


class Metrics:
    """Counts kept by the service; :meth:`render` adds the gauges read at scrape time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._outcomes: dict[str, int] = {}
        self._rejected: dict[str, int] = {}
        self._buckets = [0] * len(LATENCY_BUCKETS_S)
        self._latency_sum = 0.0
        self._latency_count = 0

    def finished(self, outcome: str, seconds: float) -> None:
        """One run (or cell) ended with ``outcome`` after ``seconds`` in the service."""
        with self._lock:
            self._outcomes[outcome] = self._outcomes.get(outcome, 0) + 1
            for i, bound in enumerate(LATENCY_BUCKETS_S):
                if seconds <= bound:
                    self._buckets[i] += 1
            self._latency_sum += seconds
            self._latency_count += 1

    def rejected(self, status: int) -> None:
        """A request refused before it ran (quota, bad input): by HTTP status."""
        with self._lock:
            key = str(status)
            self._rejected[key] = self._rejected.get(key, 0) + 1

    def render(
        self, gauges: Callable[[], Mapping[str, Iterable[tuple[Mapping[str, str], float]]]]
    ) -> str:
        """The exposition text; ``gauges`` gives name → (labels, value) samples, read now."""
        with self._lock:
            outcomes = dict(self._outcomes)
            rejected = dict(self._rejected)
            buckets = list(self._buckets)
            total, count = self._latency_sum, self._latency_count
        lines = [
            "# HELP sandcell_runs_total Runs and session cells finished, by outcome.",
            "# TYPE sandcell_runs_total counter",
        ]
        lines += [
            f'sandcell_runs_total{{outcome="{_label(k)}"}} {v}' for k, v in sorted(outcomes.items())
        ]
        lines += [
            "# HELP sandcell_requests_rejected_total Requests refused before running, by status.",
            "# TYPE sandcell_requests_rejected_total counter",
        ]
        lines += [
            f'sandcell_requests_rejected_total{{status="{k}"}} {v}'
            for k, v in sorted(rejected.items())
        ]
        lines += [
            "# HELP sandcell_run_seconds Time from accepting a run to its result.",
            "# TYPE sandcell_run_seconds histogram",
        ]
        lines += [
            f'sandcell_run_seconds_bucket{{le="{_num(b)}"}} {n}'
            for b, n in zip(LATENCY_BUCKETS_S, buckets, strict=True)
        ]
        lines += [
            f'sandcell_run_seconds_bucket{{le="+Inf"}} {count}',
            f"sandcell_run_seconds_sum {total!r}",
            f"sandcell_run_seconds_count {count}",
        ]
        for name, samples in gauges().items():
            lines.append(f"# TYPE {name} gauge")
            for labels, value in samples:
                shown = ",".join(f'{k}="{_label(v)}"' for k, v in sorted(labels.items()))
                lines.append(
                    f"{name}{{{shown}}} {_num(value)}" if shown else f"{name} {_num(value)}"
                )
        return "\n".join(lines) + "\n"
