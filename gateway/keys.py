"""API keys: made once, stored only as hashes, looked up by hash.

A key is ``sf-`` and 43 characters of URL-safe base64 (32 random bytes).
The registry (``[orgs.<org>] api_keys``) holds ``sha256:<hex>`` of the whole
key, never the key: whoever reads the configuration cannot call as the org.
A key of 256 random bits needs no slow hash (there is nothing to guess), and
the lookup is a dictionary of hashes, so a caller's timing says nothing
about how close a wrong key came.

Pure: no I/O, no logging. The key itself must never reach a log line, a
metric label, a dead letter or an error message; nothing here returns it
except :func:`new_key`, whose caller prints it once.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from schemas.config import Config

__all__ = ["KEY_PREFIX", "KeyRing", "hash_key", "new_key"]

#: Every key starts with this: a leaked one is recognisable in a scan.
KEY_PREFIX = "sf-"
#: A presented token longer than this is not one of ours; it is not hashed.
_MAX_KEY_CHARS = 256


def new_key() -> str:
    """A fresh key: ``sf-`` and 32 random bytes as URL-safe base64."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_key(key: str) -> str:
    """``sha256:<hex>`` of ``key``: what the registry lists."""
    return "sha256:" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


class KeyRing:
    """Which org a key proves, from the registry's hashes; rebuilt on every reload.

    Immutable once built: a reload builds a new ring and swaps it in whole,
    so a request is checked against one registry, old or new, never a mix.
    """

    __slots__ = ("_orgs",)

    def __init__(self, hashes_by_org: Mapping[str, list[str]]):
        self._orgs: dict[str, str] = {}
        for org, hashes in hashes_by_org.items():
            for h in hashes:
                self._orgs[h] = org

    @classmethod
    def of(cls, config: Config) -> KeyRing:
        """The ring of a :class:`schemas.config.Config`: every org's ``api_keys``."""
        return cls({name: list(org.api_keys) for name, org in config.orgs.items()})

    def __len__(self) -> int:
        return len(self._orgs)

    def org_of(self, authorization: str | None) -> str | None:
        """The org an ``Authorization`` header proves, or None (missing, malformed, unknown).

        The answer is the same None whatever was wrong, so the caller cannot
        tell a revoked key from a typo.
        """
        if not authorization:
            return None
        scheme, _, token = authorization.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token or len(token) > _MAX_KEY_CHARS:
            return None
        return self._orgs.get(hash_key(token))
