"""sandcell's guest agent: pid 1 of the microVM (standalone, stdlib only, no sandcell imports).

This package is copied into the guest's image at ``/opt/sandcell/guest`` and started by the
entry script ``/opt/sandcell/agent.py`` (``microvm/_agent.py``); its modules import one another
relatively and nothing of the host's ``sandcell``, so the same code runs on the host's tests as
``sandcell.backends.microvm.guest``.

Boot (:mod:`.boot`): mount /tmp, /run and the cgroup2 hierarchy, find the virtio-serial port
named ``sandcell`` (:mod:`.port`), start the runner (``runner.py``: the runtime's interpreter,
which imports the preload modules named on the kernel command line ``sandcell.preload=``) and
wait until it is ready. Then answer the host's handshake (``SCHELLO``/``SCGO``/``SCREADY``; a VM
restored from a snapshot resumes here, waiting for its host). Per VM, exactly one job
(:mod:`.main`):

1. the job (JSON, :mod:`.job`): fresh entropy (added with RNDADDENTROPY, then a forced reseed of
   the kernel's generator), the host's wall clock, a fresh hostname; the inputs (written to a
   tmpfs at /inputs, remounted read-only; the run's cache packages likewise at /packages), the
   size-capped workspace tmpfs at /sandbox, a private /tmp, the program at /sandcell
   (read-only), the program's cgroup (memory, pids; :mod:`.cgroup`);
2. the runner is handed the job and the program's pipes (:mod:`.run`); it joins the cgroup, sets
   the rlimits, drops to uid 1000 and runs the program. Output is streamed to the host while the
   program runs (:class:`.batch.Batch`: capped here too, small writes sent together at most
   :data:`.batch.BATCH_DELAY_S` later); stdin is fed from the host. A ``K`` frame kills the
   program's cgroup;
3. the exit frame (status, OOM kills, CPU time, peak memory), then the files of /sandbox that
   match the export globs (and the display directory), walked without following any link
   (:mod:`.files`), then ``Z``; the VM is then destroyed by the host.

A session (``Q`` instead of ``J``, :mod:`.session`) sets up the same way, then the runner becomes
the session's kernel (the host's ``_kernel.py``, sent with the job, run by
:data:`.session.SESSION_BOOT`) with its control channel, stdout and stderr held here: ``C``
frames carry the host's kernel messages in, ``M`` frames the kernel's out (each followed by an
``a`` frame with the cgroup's usage), output goes out as ``O``/``E`` capped per cell, ``I``
interrupts the kernel (SIGINT), ``K`` kills the cgroup, ``T`` lists the workspace's files (``N``)
and ``U`` sends files (workspace globs, or a cell's display directory) as a run's exports; ``X``
reports the kernel's end. The agent acknowledges the session job with ``q`` at once, so that a
host can tell an agent without sessions (which ignores the job) from a slow guest.

A job with ``sockets`` (a run or a session whose profile has an allowlist or tools) gets
/run/sandcell before its inputs: the client and bridge sources in ``lib/``, ``egress.sock`` and
``tools.sock`` served by :class:`.forward.Forwarder` (each connection a program makes travels
over the port as ``R`` frames to the host's relay, ``relay.py``, under its credit flow control),
the loopback interface up, and, for egress, the bridge on 127.0.0.1:3128 in the program's cgroup
as its user (:mod:`.bridge`); then an ``R`` ready frame.

Everything the program can touch is treated as hostile here too: the walk never follows a link,
and sizes are capped. The host re-checks everything.

Not imported at run time anywhere in the package: ``typing`` (pid 1 of a guest starts faster
without it); annotations name it under ``TYPE_CHECKING`` only.
"""
