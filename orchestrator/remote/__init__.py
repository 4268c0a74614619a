"""Runs on another machine over SSH: a lab server or a Vagrant VM (docs/remote.md).

The pieces, in the order a remote run meets them:

- ``inventory``: the machines file (YAML) validated into :class:`Machine` objects; a
  machine named by a Vagrant directory gets its address from ``vagrant`` (``vagrant.py``
  parses ``vagrant ssh-config``);
- ``hostkeys``: the machine's host key checked against a known_hosts file, refused when
  unknown or changed unless the user accepts a new one deliberately;
- ``connection``: one paramiko SSH connection with connect, command and idle timeouts, and
  commands built from argument lists (``shlex.join``), never from glued strings;
- ``sync``: the checkout's tracked files copied there over SFTP (no git needed there);
- ``job``: the small process that runs a command there detached from the connection
  (stdlib only: it runs under the far side's system Python, before any ``.venv`` exists);
  ``jobs``: this side of it (start, follow its output, interrupt, wait);
- ``operations``: what the commands do with these: set a machine up, run a command of
  ``astral`` there and bring the bundle home, fetch a run's bundle later.

Everything here stays on this side of the layering: it imports ``topologies.errors`` and
the package's ``REPO``, nothing of the emulation; the far side runs its own ``astral``.
"""
