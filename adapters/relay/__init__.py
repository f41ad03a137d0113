"""Where georep meets Azure Relay Hybrid Connections, and plain HTTP(S) services (SPEC §2.5).

- :class:`HybridConnectionEndpoint`: a sender, in HTTP mode (SAS in the
  ``ServiceBusAuthorization`` header) or WebSocket mode (``sb-hc-action=connect``).
- :class:`HybridConnectionListener`: serves one handler on several hybrid connections
  (control channel ``sb-hc-action=listen``, ``accept`` rendezvous, ``request``/``response``
  frames, ``renewToken`` before expiry).
- :class:`PlainHttpEndpoint`: a service not on Azure Relay.
- :class:`SasTokenProvider` and :func:`mint_sas_token`: tokens minted locally from a key.

Install with ``pip install 'georep[relay]'``.
"""

from __future__ import annotations

__all__ = [
    "HybridConnection",
    "HybridConnectionEndpoint",
    "HybridConnectionListener",
    "ListenerStats",
    "PlainHttpEndpoint",
    "RelayHandler",
    "RelayMode",
    "SasTokenProvider",
    "mint_sas_token",
]

from georep._extras import require_extra

require_extra("georep.adapters.relay", "relay", "aiohttp", "websockets")

from ._endpoint import HybridConnectionEndpoint, PlainHttpEndpoint, RelayMode
from ._listener import HybridConnectionListener, ListenerStats, RelayHandler
from ._sas import HybridConnection, SasTokenProvider, mint_sas_token
