"""ECMP with the same hash on every switch: polarization, on purpose.

Identical to ``ecmp`` (``controllers.policies.ecmp``) except that every switch's select
groups use the same basis (:data:`POLARIZED_BASIS`). A flow's hash is then the same at every
tier; a switch one tier up receives only the flows that picked one particular bucket below
and, with as many buckets, sends all of them to the same bucket index again, so some upper
links carry everything and others nothing. Compare against ``ecmp``'s per-switch salt.
"""

from __future__ import annotations

from controllers.multipath import Route
from controllers.policies.ecmp import EcmpPolicy

POLARIZED_BASIS = 0


class EcmpPolarizedPolicy(EcmpPolicy):
    name = "ecmp-polarized"

    def basis(self, route: Route) -> int:
        return POLARIZED_BASIS
