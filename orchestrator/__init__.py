"""The checkout this package runs from, named once: the controller and worker processes it
starts import this tree through it (installed or not), and the shipped experiments live in it.
"""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
