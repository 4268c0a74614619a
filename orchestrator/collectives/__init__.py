"""Collectives as data: what each operation is, how its algorithms move bytes, how nccl-tests
reports it. Pure; the worker imports some of it, so nothing heavy belongs here.

- operations.py: the collective operations (bus factor, redop, root, per-rank buffer);
- plans.py: the algorithms, as plans, and their registry (what experiments may name);
- program.py: collectives on groups of ranks, transfers and compute composed into one plan;
- nccl.py: nccl-tests' table: sizes and counts as it rounds them, algbw, busbw, the text;
- ceilings.py: the busbw a collective can reach on a fabric, from its plans;
- sizes.py: message sizes as people write them (``64K``, ``1M``).
"""
