"""The core's one door to the SDK: what the convenience constructors need from adapters.

The core (``georep/``) defines the ports and never depends on an adapter, with one declared
exception: the constructors that build SDK clients for the caller
(``GeoSender.from_connection_strings`` and friends, and the wrapping of an SDK sender or
receiver given to a constructor) need ``georep.adapters.servicebus``. They import it from
here and from nowhere else; ``tests/unit/test_layers.py`` fails if another core module
imports ``georep.adapters``. (The application, ``georep.cli``, sits above both and imports
adapters freely.)

This module imports the adapter at the top, so reading this file shows the whole edge. Its
callers import it inside the function that needs it, never at module level: the SDK is an
optional extra (``pip install 'georep[servicebus]'``), so ``import georep`` must not load it;
without the extra the import raises ImportError with that hint.
"""

from __future__ import annotations

from georep.adapters import servicebus as _servicebus

# What the core takes from the adapter, name by name.
from_backlog = _servicebus.from_backlog
make_ping = _servicebus.make_ping
open_region_receiver = _servicebus.open_region_receiver
open_region_sender = _servicebus.open_region_sender
open_region_sessions = _servicebus.open_region_sessions
region_receiver_for = _servicebus.region_receiver_for
region_sender_for = _servicebus.region_sender_for
to_backlog = _servicebus.to_backlog
