"""Synthetic collective workers: one process per emulated GPU, moving and verifying real bytes.

Two halves, split so that the worker process imports only what it needs (its algorithms,
its wire protocol, numpy and the standard library; never Mininet, os-ken or matplotlib)::

    orchestrator side                         worker process (python -m orchestrator.worker)
    -----------------                         ----------------------------------------------
    launcher.Launcher  --- Unix socket --->   worker.main
      spawns workers (a ``spawn`` callable:     protocol     coordination messages (JSON lines)
      subprocess.Popen on loopback,             collectives  algorithms as plans (pure data)
      host.popen in Mininet), rendezvous,       buffers      fill pattern, reduction, checking
      peer table, barriers, timings,            transport    TCP connections, byte counters,
      failure detection, nccl-tests rows                     the 10 ms sampler
    spec     what a launch is given             executor     runs a plan over the connections
    outcome  what it returns (RunResult,
             Failure: plain data)

Vocabulary: a *rank* is one worker (one GPU); its *server* groups the ranks that share an
NVLink domain and its *local rank* is its rail. A *plan* is what one rank does in one
collective: *steps*, each a set of sends, receives and local copies of buffer *regions*.
A *connection* carries data one way, from the rank that opened it to its peer, on one
*channel*; its five-tuple is known and reported.

Nothing here is imported by ``orchestrator.worker`` itself: import the module you need.
"""
