"""A Vagrant VM as a remote machine: its address, port, user and key from ``vagrant ssh-config``.

``vagrant ssh-config [NAME]``, run in the Vagrant directory, prints an OpenSSH client
configuration for each running machine of that Vagrantfile::

    Host default
      HostName 127.0.0.1
      User vagrant
      Port 2222
      UserKnownHostsFile /dev/null
      StrictHostKeyChecking no
      PasswordAuthentication no
      IdentityFile /home/me/astral-testbed/.vagrant/machines/default/virtualbox/private_key
      IdentitiesOnly yes
      LogLevel FATAL

Of it only ``HostName``, ``Port``, ``User`` and ``IdentityFile`` are used. Vagrant's own
``UserKnownHostsFile /dev/null`` and ``StrictHostKeyChecking no`` (it trusts any key) are
deliberately ignored: the host key is checked like any other machine's
(``orchestrator/remote/hostkeys.py``).
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from topologies.errors import RemoteError

VAGRANT_TIMEOUT = 120.0  # `vagrant ssh-config` loads the Vagrantfile and asks the provider


@dataclass(frozen=True)
class SshConfig:
    """What a Host block of ``vagrant ssh-config`` says about reaching one VM."""

    host: str
    port: int
    user: str
    key_file: Path | None


def parse_ssh_config(text: str, machine: str | None, source: str) -> SshConfig:
    """The Host block named ``machine`` (the only one when ``machine`` is None) of an OpenSSH
    client configuration as Vagrant prints it. ``source`` names where the text came from in
    errors (RemoteError: the text is Vagrant's, not the user's)."""
    blocks: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            raise RemoteError(
                f"{source}: line {number} is not ssh-config syntax: {raw!r}"
            ) from None
        if not words:
            continue
        keyword, values = words[0].lower(), words[1:]
        if "=" in keyword:  # `Key=value`, which ssh_config(5) also allows
            keyword, _, first = keyword.partition("=")
            values = [first, *values] if first else values
        if keyword == "host":
            current = blocks.setdefault(" ".join(values), {})
        elif current is not None and values:
            current.setdefault(keyword, " ".join(values))  # first value wins, as in ssh
    if not blocks:
        raise RemoteError(f"{source}: no 'Host' block (is the VM running? 'vagrant up')")
    if machine is None:
        if len(blocks) > 1:
            raise RemoteError(
                f"{source}: several machines ({', '.join(sorted(blocks))}); name one with "
                "'vagrant_machine:' in the inventory"
            )
        (block,) = blocks.values()
    elif machine in blocks:
        block = blocks[machine]
    else:
        raise RemoteError(f"{source}: no machine {machine!r}; it lists {', '.join(sorted(blocks))}")
    for required in ("hostname", "user", "port"):
        if required not in block:
            raise RemoteError(f"{source}: the Host block has no {required.capitalize()}")
    try:
        port = int(block["port"])
    except ValueError:
        raise RemoteError(f"{source}: Port is not a number: {block['port']!r}") from None
    identity = block.get("identityfile")
    return SshConfig(
        host=block["hostname"],
        port=port,
        user=block["user"],
        key_file=Path(identity).expanduser() if identity else None,
    )


def ssh_config(directory: Path, machine: str | None = None) -> SshConfig:
    """Ask Vagrant, in ``directory``, how to reach its (running) VM."""
    vagrant = shutil.which("vagrant")
    if vagrant is None:
        raise RemoteError(
            f"the inventory names a Vagrant machine ({directory}), but 'vagrant' is not on PATH"
        )
    argv = [vagrant, "ssh-config", *([machine] if machine else [])]
    source = f"'vagrant ssh-config' in {directory}"
    try:
        done = subprocess.run(
            argv, cwd=directory, capture_output=True, text=True, timeout=VAGRANT_TIMEOUT
        )
    except subprocess.TimeoutExpired:
        raise RemoteError(f"{source} did not answer within {VAGRANT_TIMEOUT:.0f} s") from None
    except OSError as err:
        raise RemoteError(f"{source} could not start: {err}") from None
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        reason = said[-1] if said else f"exit status {done.returncode}"
        raise RemoteError(f"{source} failed (is the VM up? 'vagrant up'): {reason}")
    return parse_ssh_config(done.stdout, machine, source)
