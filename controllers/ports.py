"""Model port numbers <-> OpenFlow port numbers, per switch.

Plans (:mod:`controllers.plan`) speak the model's port numbers (``topologies.model``); the
switches speak OpenFlow port numbers. They are the same unless the emulation could not get
the number it asked for.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from topologies.description import FabricDescription


class PortMap:
    """Model port <-> OpenFlow port, per switch.

    The emulation asks Open vSwitch for ``ofport = model port`` (``ofport_request``); where it
    could not, it publishes ``description.extra["ofports"] = {switch: {model_port: ofport}}``
    (JSON object keys are strings). Ports not in the map keep their model number.
    """

    def __init__(self, ofports: Mapping[str, Mapping[Any, Any]] | None = None) -> None:
        self._to_of: dict[str, dict[int, int]] = {}
        self._to_model: dict[str, dict[int, int]] = {}
        for switch, ports in (ofports or {}).items():
            forward = {int(model): int(of) for model, of in ports.items()}
            self._to_of[switch] = forward
            self._to_model[switch] = {of: model for model, of in forward.items()}

    @classmethod
    def of(cls, description: FabricDescription) -> PortMap:
        raw = description.extra.get("ofports")
        if raw is not None and not isinstance(raw, Mapping):
            raise ValueError("description.extra['ofports'] must map switch -> {port: ofport}")
        return cls(raw)

    def ofport(self, switch: str, model_port: int) -> int:
        return self._to_of.get(switch, {}).get(model_port, model_port)

    def model_port(self, switch: str, ofport: int) -> int:
        return self._to_model.get(switch, {}).get(ofport, ofport)
