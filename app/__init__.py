"""The application: the ``serving-fairness`` command and what runs the pipeline whole.

The top layer (``docs/architecture.md``): the command line (:mod:`app.cli`),
the pipeline in one process (:mod:`app.stack`) or as processes
(:mod:`app.processes`), the demo and the replay command. It may import every
layer below it; nothing imports it.
"""
