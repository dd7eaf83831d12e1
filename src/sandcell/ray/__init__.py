"""sandcell on a Ray cluster: ``sandcell batch --ray`` and an API for Ray programs.

Ray is an optional extra (``pip install 'sandcell[ray]'``); nothing here imports it until it is
used. Every node that runs sandboxes offers them as the custom resource ``sandcell_slots``
(``ray start --resources='{"sandcell_slots": 4}'``) and has its own sandcell home
(``$SANDCELL_HOME`` where its ``ray start`` ran): its runs are recorded there.

- :func:`~sandcell.ray.driver.run_batch_on_ray`: a batch's tasks run by one worker actor per
  node, with the local batch's results file and resume rules (see docs/ray.md).
- :class:`~sandcell.ray.api.Programs`: a ``Dataset.map_batches`` callable;
  :func:`~sandcell.ray.api.submit` / :func:`~sandcell.ray.api.run_program`: one program from a
  Ray task.
- :func:`task_index`: task → node → run id, read back from a results file.
"""

from __future__ import annotations

from sandcell.ray._ray import SLOTS
from sandcell.ray.api import Programs, run_program, submit
from sandcell.ray.driver import RaySummary, run_batch_on_ray
from sandcell.ray.index import NodeRun, task_index

__all__ = [
    "SLOTS",
    "NodeRun",
    "Programs",
    "RaySummary",
    "run_batch_on_ray",
    "run_program",
    "submit",
    "task_index",
]
