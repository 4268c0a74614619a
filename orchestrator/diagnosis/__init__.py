"""Root-cause localization on a results bundle: which link, switch, GPU or the controller
broke, what fault it looks like, and the evidence across the layers (``astral diagnose``).

:func:`diagnose_bundle` reads a bundle (:mod:`.evidence`), runs the detectors on it
(:mod:`.detectors`) and merges, reconciles and ranks what they find (:mod:`.diagnose`).
"""

from orchestrator.diagnosis.diagnose import diagnose, diagnose_bundle
from orchestrator.diagnosis.model import Diagnosis, Suspect

__all__ = ["Diagnosis", "Suspect", "diagnose", "diagnose_bundle"]
