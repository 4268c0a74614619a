"""GPUs of other machines in this process's Mininet, as Mininet's cluster edition makes them.

The cluster edition (``mininet.examples.cluster``) represents a node on another server by
:class:`RemoteHost`: a Mininet node whose shell is an SSH session to its server running
``mnexec`` there, so that ``cmd``, ``sendCmd``, ``popen`` and Mininet's CLI work on it as on
a local host. Its own shell makes a new namespace; here the namespace exists already (that
machine's part made it, orchestrator.commands.cluster_part), so :class:`AttachedHost`, a
subclass, enters it instead (``mnexec -a PID``), and logs in the way the rest of a cluster
run does (the inventory's key and ``known_hosts``, orchestrator.cluster.ssh) rather than
the cluster edition's ``sudo -u USER ssh`` with that user's own keys.

The cluster edition is imported only when such a host is made (``astral up --cluster
--cli``): it imports ``distutils``, which Python 3.12 no longer ships.
"""

from __future__ import annotations

from typing import Any

from orchestrator.cluster.ssh import SshMachine


def attached_host(name: str, ssh: SshMachine, pid: int) -> Any:
    """A Mininet node for GPU ``name``, on ``ssh``'s machine, in the namespace of ``pid``."""
    from mininet.examples.cluster import RemoteHost
    from mininet.node import Node

    class AttachedHost(RemoteHost):
        def __init__(self) -> None:
            self.attach_pid = pid
            self.uses_sudo = ssh.machine.uses_sudo(ssh.endpoint)
            self.sshbase = ["ssh", *ssh.options(), "-tt"]  # read by RemoteMixin.__init__
            super().__init__(
                name, server=ssh.host, user=ssh.endpoint.user, serverIP=ssh.host,
                inNamespace=False,
            )  # fmt: skip

        def startShell(self, *args: Any, **kwargs: Any) -> None:
            if self.shell:
                return
            # no `sudo -u USER ssh` (RemoteMixin's): the inventory's key, not that user's
            self.sshcmd = [*self.sshbase, f"{ssh.endpoint.user}@{ssh.host}"]
            # RemoteMixin.startShell would pass `mnexec -c` (a new namespace with
            # inNamespace): enter the GPU's instead
            Node.startShell(self, mnopts=f"-ca{self.attach_pid}")
            self.sendCmd("echo $$")
            self.finishInit()

        def _popen(self, cmd: Any, sudo: bool | None = None, **params: Any) -> Any:
            return super()._popen(cmd, sudo=self.uses_sudo if sudo is None else sudo, **params)

    return AttachedHost()
