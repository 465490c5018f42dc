"""The daemon's front: where application processes open sessions and hand batches over.

:class:`SidecarFront` composes the parts, each owning its state: the endpoint
(:mod:`.endpoint`), the sessions (:mod:`.sessions`), the replies (:mod:`.replies`), the memory
handshake and take-back (:mod:`.memory_handshake`), the per-process quotas (:mod:`.quotas`), the
block grants (:mod:`.grants`), the seals (:mod:`.seals`), the delivery reports (:mod:`.reports`),
the topics' metadata (:mod:`.topic_updates`) and the checks of what clients send (:mod:`.checks`).
"""

from .endpoint import EndpointInUseError
from .settings import FrontSettings
from .sidecar_front import SidecarFront

__all__ = ["EndpointInUseError", "FrontSettings", "SidecarFront"]
