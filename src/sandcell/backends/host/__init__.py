"""What every rung shares on the host: the floor plan under the backends.

The workspace and run directories (``workspace``), cgroups, seccomp, Landlock and rlimits, the
neutral view of the runtime and its bytecode (``neutral_sources``, ``neutral_bytecode``), the runs
in flight and their cancel (``runs``), process plumbing (``process``), finding bubblewrap
(``bubblewrap``), and the paths inside every sandbox (``layout``). A rung imports this package,
``backends.base`` and ``backends.warm``, never another rung (``tests/unit/test_floor_plan.py``).
"""
