"""Replay of recorded runs: re-run what a record says ran, and compare what came out.

- :mod:`sandcell.replay.evidence`: what the executor adds to every record for a replay.
- :mod:`sandcell.replay.plan`: from a record to the request that re-runs it, or a refusal.
- :mod:`sandcell.replay.run`: check the log, run the plan through the executor, compare.
- :mod:`sandcell.replay.compare`: two records side by side.
- :mod:`sandcell.replay.render`: the report as text.

``Executor.replay(run_id)`` and ``sandcell audit replay RUN_ID`` are the entry points.
"""

from sandcell.replay.compare import Comparison, FieldCheck, compare_records
from sandcell.replay.plan import ReplayPlan, ReplayRefused, build_plan
from sandcell.replay.run import ReplayReport, load_original, replay

__all__ = [
    "Comparison",
    "FieldCheck",
    "ReplayPlan",
    "ReplayRefused",
    "ReplayReport",
    "build_plan",
    "compare_records",
    "load_original",
    "replay",
]
