"""Host keys: a machine is trusted only if its key is the one a known_hosts file records.

OpenSSH's rules, kept: a key found in the file for the host (``[host]:port`` when the port
is not 22) is accepted; a different key for that host is refused as *changed* (either the
connection is intercepted or the machine was reinstalled: only a person can tell, so the
message says how to remove the old entry); a host the file does not know is refused as
*unknown*, unless the user passed ``--accept-new-host-key`` (trust on first use, OpenSSH's
``StrictHostKeyChecking=accept-new``): then its key is appended to that same file, so that
every later connection is checked against it. Accepting never replaces a changed key.

The file is the inventory's ``known_hosts`` (default the user's ``~/.ssh/known_hosts``; a
Vagrant machine's own file under its ``.vagrant`` directory), read with paramiko's parser
(hashed entries included) and only ever appended to, one line, never rewritten.
"""

from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path

import paramiko


def fingerprint(key: paramiko.PKey) -> str:
    """``ssh-ed25519 SHA256:...`` as ``ssh-keygen -l`` prints it."""
    digest = base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")
    return f"{key.get_name()} SHA256:{digest}"


def known_name(host: str, port: int) -> str:
    """How known_hosts names the host: ``host``, or ``[host]:port`` off port 22."""
    return host if port == 22 else f"[{host}]:{port}"


class UnknownHostKey(Exception):
    """The file does not know the host; carries what is needed for the message."""

    def __init__(self, name: str, key: paramiko.PKey, file: Path) -> None:
        self.name = name
        self.key = key
        self.file = file
        super().__init__(f"unknown host key for {name}")


def load_known_hosts(client: paramiko.SSHClient, file: Path) -> None:
    """Trust the keys ``file`` records (none when it does not exist yet)."""
    if file.exists():
        client.load_host_keys(str(file))


def record(file: Path, name: str, key: paramiko.PKey) -> None:
    """Append one known_hosts line for ``name`` (the directory made 0700, the file 0600 if
    new, as ssh does)."""
    file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    line = paramiko.hostkeys.HostKeyEntry([name], key).to_line()
    assert line is not None  # None only for an entry without a key
    descriptor = os.open(file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(descriptor, "a", encoding="ascii") as stream:
        if stream.tell() > 0 and not file.read_bytes().endswith(b"\n"):
            stream.write("\n")
        stream.write(line)


class HostKeyPolicy(paramiko.MissingHostKeyPolicy):
    """What paramiko asks when the host is not in the loaded file (a changed key never gets
    here: paramiko raises BadHostKeyException itself)."""

    def __init__(self, file: Path, accept_new: bool) -> None:
        self.file = file
        self.accept_new = accept_new
        self.accepted: str | None = None  # the fingerprint recorded, for the caller to say

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        if not self.accept_new:
            raise UnknownHostKey(hostname, key, self.file)
        record(self.file, hostname, key)
        client.get_host_keys().add(hostname, key.get_name(), key)
        self.accepted = fingerprint(key)


def unknown_message(error: UnknownHostKey) -> str:
    return (
        f"host key of {error.name} is unknown: {fingerprint(error.key)} is not in "
        f"{error.file}. If that is the machine's key (there: 'ssh-keygen -lf "
        "/etc/ssh/ssh_host_ed25519_key.pub'), accept it deliberately with "
        f"--accept-new-host-key, which records it in {error.file}"
    )


def changed_message(name: str, offered: paramiko.PKey, expected: paramiko.PKey, file: Path) -> str:
    return (
        f"host key of {name} has CHANGED: {file} records {fingerprint(expected)}, the machine "
        f"offered {fingerprint(offered)}. Either the connection is intercepted or the "
        "machine was reinstalled; refused. If you know it was reinstalled, remove the old "
        f"entry ('ssh-keygen -R {_quoted(name)} -f {file}') and connect again with "
        "--accept-new-host-key"
    )


def _quoted(name: str) -> str:
    return f"'{name}'" if name.startswith("[") else name
