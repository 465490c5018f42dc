"""The daemon's per-record work, in C or in pure Python: chosen once, when this module is first imported.

Two twins with the same names, behaviour and errors: the C extension ``service._fastpath``
(``service/_fastpath.c``) and ``service/_fastpath_py.py``. Chosen as the client's are
(``client_stub.fastpath``): the extension unless it cannot be imported or the environment variable
``KAFKA_SIDECAR_PURE_PYTHON`` is true. ``IMPLEMENTATION`` says which is in use: "c" or "python".
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from client_stub.fastpath import load

__all__ = ["IMPLEMENTATION", "MAX_LINGER_MS", "UNSEEN", "claim_ready", "copy_records", "rebase_records",
           "seal_claimed"]

if TYPE_CHECKING:
    # Whichever twin load() returns has the names and types of the extension's stub, service/_fastpath.pyi.
    from . import _fastpath as _module

    IMPLEMENTATION: str
else:
    _module, IMPLEMENTATION = load("service._fastpath", "service._fastpath_py")

claim_ready = _module.claim_ready
# claim_ready()'s first_seen word of a block where no open batch was seen since its last claim (INT64_MIN).
UNSEEN = -(1 << 63)
# The longest linger.ms claim_ready() takes from a client's header, and the longest early_ms: a day.
MAX_LINGER_MS = 86_400_000
copy_records = _module.copy_records
rebase_records = _module.rebase_records
seal_claimed = _module.seal_claimed
