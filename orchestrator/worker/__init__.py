"""Synthetic collective workers: one process per emulated GPU, moving and verifying real bytes.

Two halves, split so that the worker process imports only what it needs (its algorithms,
its wire protocol, numpy and the standard library; never Mininet, os-ken or matplotlib)::

    orchestrator side                         worker process (python -m orchestrator.worker)
    -----------------                         ----------------------------------------------
    launcher.Launcher  --- Unix socket --->   worker.main
      spawns workers (a ``spawn`` callable:     protocol     coordination messages (JSON lines)
      subprocess.Popen on loopback,             buffers      fill pattern, reduction, checking
      host.popen in Mininet), rendezvous,       transport    TCP connections, byte counters,
      peer table, barriers, timings,                         the 10 ms sampler
                                                rto          the minimum RTO asked, read back
      failure detection, nccl-tests rows        executor     runs a plan over the connections
    spec     what a launch is given
    outcome  what it returns (RunResult,
             Failure: plain data)

The plans themselves (collective algorithms as pure data) live in
``orchestrator.collectives.plans``, shared with the orchestrator's side.

Vocabulary: a *rank* is one worker (one GPU); its *server* groups the ranks that share an
NVLink domain and its *local rank* is its rail. A *plan* is what one rank does in one
collective: *steps*, each a set of sends, receives and local copies of buffer *regions*.
A *connection* carries data one way, from the rank that opened it to its peer, on one
*channel*; its five-tuple is known and reported.

Nothing here is imported by ``orchestrator.worker`` itself: import the module you need.
"""
