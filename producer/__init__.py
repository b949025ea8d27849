"""Admission: what enters the pipeline, and the client library that sends it.

* :mod:`producer.ratelimit` — GCRA limits per org x endpoint x window, in
  requests and tokens (pure, clock passed in).
* :mod:`producer.throttle` — the predicted wait from the scheduler's
  snapshots, and the overload check (pure).
* :mod:`producer.admission` — the decision for one ingress record: admitted,
  refused (with a ``Result``), or dead letter (pure apart from the limiter and
  throttle state passed in). Its docstring lists every check, in order, with
  its status and reason code.
* :mod:`producer.service` — the admission service around it (Kafka, metrics,
  health, hot reload) and the ``admission`` subcommand.
* :mod:`producer.client` — :class:`~producer.client.FairnessClient` for
  upstream services and the ``submit`` subcommand.

Modules are imported on demand: importing this package loads nothing else.
"""
