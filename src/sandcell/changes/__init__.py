"""The patch workflow: a copy of a directory as a run's working directory, the run's change
set as artifacts, and applying an approved change set back (docs/changes.md).

Modules: :mod:`~sandcell.changes.manifest` (the state of a tree), ``snapshot`` (copy-in),
``program`` (the frame the sandbox runs), ``diff`` (the change set), ``workdir`` (one run),
``run`` (the executor call), ``record`` (a run's change set, verified), ``approvals`` (approvals
bound to a change-set hash) and ``apply`` (writing it into a target).
"""
