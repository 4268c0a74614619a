"""One SSH connection to a machine of the inventory (paramiko), with its three timeouts.

- *connect*: reaching the address, the SSH handshake, authentication, opening a channel;
- *idle*: any single answer once connected (an SFTP request, a short command); a network
  that stays silent this long is taken as lost, instead of waiting for TCP to give up;
- *command*: how long a command there may run (``jobs.py`` and the job there enforce it).

Commands are argument lists: :meth:`Connection.run` quotes them with ``shlex.join`` and the
far side's shell only splits them back; nothing is glued into a command line. Login is by
key only: the inventory's key file (or ssh-agent and ``~/.ssh``'s default keys when it names
none); a password is never sent. Every failure becomes a :class:`RemoteError` sentence that
names the machine and what to check.
"""

from __future__ import annotations

import logging
import shlex
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType

import paramiko

from orchestrator.remote.hostkeys import (
    HostKeyPolicy,
    UnknownHostKey,
    changed_message,
    known_name,
    load_known_hosts,
    unknown_message,
)
from orchestrator.remote.inventory import Endpoint, Machine
from topologies.errors import RemoteError

# paramiko logs what it then raises ("Exception (client): Error reading SSH protocol
# banner"); without a handler Python prints that to stderr beside the sentence we print.
logging.getLogger("paramiko").addHandler(logging.NullHandler())


class ConnectionLost(RemoteError):
    """The connection broke or went silent once it was open (what was running there goes on)."""


@dataclass(frozen=True)
class Completed:
    """A short command's exit status and output."""

    status: int
    stdout: str
    stderr: str


class Connection:
    """``with Connection(machine) as ssh:`` an open, host-key-checked SSH connection."""

    def __init__(self, machine: Machine, *, accept_new_host_key: bool = False) -> None:
        self.machine = machine
        self.accept_new_host_key = accept_new_host_key
        self.endpoint: Endpoint | None = None
        self.accepted_key: str | None = None  # a fingerprint recorded on this connection
        self._client: paramiko.SSHClient | None = None
        self._sftp: paramiko.SFTPClient | None = None

    @property
    def name(self) -> str:
        where = self.endpoint.address if self.endpoint else "?"
        return f"{self.machine.name} ({where})"

    @property
    def sudo(self) -> list[str]:
        """The prefix that runs a command as root there: empty for root, ``sudo -n --``."""
        assert self.endpoint is not None
        return ["sudo", "-n", "--"] if self.machine.uses_sudo(self.endpoint) else []

    def __enter__(self) -> Connection:
        self.open()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def open(self) -> None:
        machine = self.machine
        self.endpoint = endpoint = machine.endpoint()
        timeout = machine.timeouts.connect
        key = endpoint.key_file
        if key is not None and not key.is_file():
            raise RemoteError(f"{self.name}: the key file {key} ({machine.source}) does not exist")
        client = paramiko.SSHClient()
        load_known_hosts(client, machine.known_hosts)
        policy = HostKeyPolicy(machine.known_hosts, self.accept_new_host_key)
        client.set_missing_host_key_policy(policy)
        began = time.monotonic()
        try:
            client.connect(
                endpoint.host,
                port=endpoint.port,
                username=endpoint.user,
                key_filename=str(key) if key else None,
                look_for_keys=key is None,
                allow_agent=True,
                password=None,
                timeout=timeout,
                banner_timeout=timeout,
                auth_timeout=timeout,
                channel_timeout=timeout,
            )
        except UnknownHostKey as err:
            raise RemoteError(f"{self.machine.name}: {unknown_message(err)}") from None
        except paramiko.BadHostKeyException as err:
            name = known_name(endpoint.host, endpoint.port)
            message = changed_message(name, err.key, err.expected_key, machine.known_hosts)
            raise RemoteError(f"{self.machine.name}: {message}") from None
        except paramiko.PasswordRequiredException:
            raise RemoteError(
                f"{self.name}: the key {key} is encrypted; load it into ssh-agent "
                "(ssh-add) instead: passphrases are not read from files either"
            ) from None
        except paramiko.AuthenticationException:
            which = f"the key {key}" if key else "ssh-agent's and ~/.ssh's keys"
            raise RemoteError(
                f"{self.name}: user {endpoint.user!r} was refused with {which} (is its public "
                "key in that user's authorized_keys there, and may that user log in?)"
            ) from None
        except TimeoutError:
            raise RemoteError(
                f"{self.name}: no answer within {timeout:g} s (timeouts.connect in "
                f"{machine.source}); is the address right and the machine up?"
            ) from None
        except ConnectionRefusedError:
            raise RemoteError(
                f"{self.name}: connection refused: nothing listens on port {endpoint.port}"
            ) from None
        except socket.gaierror as err:
            raise RemoteError(f"{self.name}: cannot resolve {endpoint.host}: {err}") from None
        except (paramiko.SSHException, OSError, EOFError) as err:
            if time.monotonic() - began >= timeout * 0.9:  # paramiko words a silent server
                raise RemoteError(  # as "No existing session" or a banner error
                    f"{self.name}: no SSH answer within {timeout:g} s (timeouts.connect in "
                    f"{machine.source}); does an SSH server listen on port {endpoint.port}?"
                ) from None
            raise RemoteError(f"{self.name}: SSH connection failed: {err}") from None
        transport = client.get_transport()
        assert transport is not None
        transport.set_keepalive(max(1, int(machine.timeouts.idle / 3)))
        self._client = client
        self.accepted_key = policy.accepted

    def close(self) -> None:
        if self._sftp is not None:
            self._sftp.close()
            self._sftp = None
        if self._client is not None:
            self._client.close()
            self._client = None

    # -- using it ----------------------------------------------------------------------

    def sftp(self) -> paramiko.SFTPClient:
        """The connection's SFTP session; every request answers within the idle timeout."""
        if self._sftp is None:
            assert self._client is not None
            try:
                self._sftp = self._client.open_sftp()
            except (paramiko.SSHException, OSError, EOFError) as err:
                raise self.lost(err) from None
            channel = self._sftp.get_channel()
            assert channel is not None
            channel.settimeout(self.machine.timeouts.idle)
        return self._sftp

    def run(self, argv: Sequence[str], *, timeout: float | None = None) -> Completed:
        """Run a short command (an argument list) there, to its end; its output captured.
        ``timeout`` (default the idle timeout) bounds the whole command."""
        assert self._client is not None
        limit = timeout if timeout is not None else self.machine.timeouts.idle
        command = shlex.join(argv)
        try:
            transport = self._client.get_transport()
            if transport is None or not transport.is_active():
                raise EOFError("the connection is closed")
            channel = transport.open_session(timeout=self.machine.timeouts.connect)
            channel.settimeout(limit)
            channel.exec_command(command)
            out, err = bytearray(), bytearray()
            deadline = time.monotonic() + limit
            while not (channel.exit_status_ready() and not channel.recv_ready()
                       and not channel.recv_stderr_ready()):  # fmt: skip
                busy = False
                if channel.recv_ready():
                    out += channel.recv(65536)
                    busy = True
                if channel.recv_stderr_ready():
                    err += channel.recv_stderr(65536)
                    busy = True
                if channel.closed and not busy and not channel.exit_status_ready():
                    raise EOFError("the channel closed without an exit status")
                if time.monotonic() > deadline:
                    channel.close()
                    if timeout is None:  # a short command bounded by the idle timeout
                        raise self.lost(TimeoutError())
                    raise RemoteError(
                        f"{self.name}: {argv[0]!r} did not finish within {limit:g} s there"
                    )
                if not busy:
                    time.sleep(0.01)
            status = channel.recv_exit_status()
            channel.close()
        except RemoteError:
            raise
        except (paramiko.SSHException, OSError, EOFError) as error:
            raise self.lost(error) from None
        return Completed(status, out.decode(errors="replace"), err.decode(errors="replace"))

    def check(self, argv: Sequence[str], *, timeout: float | None = None) -> str:
        """:meth:`run`, and its stdout; a non-zero exit status is a RemoteError."""
        done = self.run(argv, timeout=timeout)
        if done.status != 0:
            said = (done.stderr or done.stdout).strip()
            raise RemoteError(
                f"{self.name}: {shlex.join(argv)} failed there (exit status {done.status})"
                + (f": {said}" if said else "")
            )
        return done.stdout

    def lost(self, error: BaseException) -> ConnectionLost:
        """The sentence for a connection that broke or went silent."""
        why = str(error) or type(error).__name__
        if isinstance(error, (TimeoutError, socket.timeout)):
            why = f"no answer within {self.machine.timeouts.idle:g} s (timeouts.idle)"
        return ConnectionLost(f"{self.name}: connection lost: {why}")
