"""``python -m orchestrator.worker``: see :mod:`orchestrator.worker.worker`."""

from orchestrator.worker.worker import main

raise SystemExit(main())
