"""Model specs and token counts, without loading a model (no torch, no numpy).

Admission counts every request's tokens with the endpoint's own tokenizer
(:mod:`tokens.counting`), and workers, admission and the traffic tools
resolve the same model specs (``wheel:...``, a folder, ``fake:...``) and
read a model folder's facts (:mod:`tokens.specs`). Below the services, so
admission and workers agree on costs without importing each other.
"""
