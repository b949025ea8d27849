"""The HTTP gateway: tenants proven by API keys, and the APIs embedding clients speak.

OpenAI's embeddings, Cohere's v2 embed and rerank, and text-embeddings-
inference's routes, each in its SDK's own shapes, in front of the fair
pipeline. :mod:`gateway.service` is the service; :mod:`gateway.server` what
every request goes through; one module per API maps its fields
(:mod:`gateway.openai_api`, :mod:`gateway.cohere_api`, :mod:`gateway.tei_api`);
:mod:`gateway.keys` holds the keys as hashes.
"""
