"""Traffic tools: the trace format, the simulator, replay, and the report of either.

Offline and operator tools around the pipeline (``docs/architecture.md``):
traffic logs (:mod:`traffic.trace`), the scheduler core on a virtual clock
(:mod:`traffic.simulate`, fitted to a live run by :mod:`traffic.calibrate`),
traffic sent through a live pipeline (:mod:`traffic.replay`), and the
report both write (:mod:`traffic.report`, :mod:`traffic.plots`). They use the
services' cores and the client; no service imports them.
"""
