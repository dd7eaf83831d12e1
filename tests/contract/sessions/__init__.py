"""The session contract, checked on every rung of the ladder with one fixture (conftest.py's
``rung`` and ``ex``), as tests/contract/test_contract.py checks the run contract.

By theme: test_cells.py (state, outputs, bash, errors, exports, records, interrupts, caps),
test_limits.py (memory, CPU time, idle, lifetime), test_lifecycle.py (close, denied cells, two
sessions), test_cancel.py, test_scopes.py, test_outside.py (proxy and gateway per cell),
test_cli.py (the session server of every rung, as root and as the ordinary user, closed or
killed and swept) and test_server.py (the server's and client's own refusals, whatever the
rung). traces.py holds what each rung leaves on the host; rungs.py the executors and
:func:`~tests.contract.sessions.rungs.only_on`, the one way a test says a rung does not apply.
"""
