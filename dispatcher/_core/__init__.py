"""The core: calls, results, the catalogue, and the sans-I/O gate and lifecycle; no anyio, no I/O.

What a call is and returns, the catalogue and what may be believed of it, and the state machines that decide
which call may start (the gate) and where each call is until its one result (the lifecycle). The driver
(`dispatcher._driver`) runs them.
"""
