"""Remote (NIXL) transport tests run on loopback only: UCX is kept to the ``lo`` device, so no
socket of any peer listens beyond 127.0.0.1."""

from __future__ import annotations

import os

os.environ.setdefault("UCX_NET_DEVICES", "lo")
