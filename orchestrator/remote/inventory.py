"""The inventory: the machines ``--on MACHINE`` and ``astral remote`` may name (YAML).

    machines:
      lab1:
        host: 10.0.0.5                # name or address (required, unless vagrant:)
        port: 22                      # optional, default 22
        user: root                    # optional, default root
        key: ~/.ssh/id_ed25519        # optional: the private key; without it ssh-agent
                                      # and ~/.ssh's default keys are tried
        project: astral-testbed       # optional: the checkout there, absolute or relative
                                      # to the login's home (default astral-testbed)
        known_hosts: ~/.ssh/known_hosts   # optional: the host keys trusted (default the
                                      # user's; a Vagrant machine's: <dir>/.vagrant/known_hosts)
        sudo: false                   # optional: run set-up and astral with `sudo -n`
                                      # (default: when the user is not root)
        timeouts: {connect: 15, idle: 60, command: 21600}   # optional, seconds
      vm:
        vagrant: .                    # a Vagrant directory: `vagrant ssh-config` there
        vagrant_machine: default      # optional: which VM of a multi-machine Vagrantfile

Local paths (``key``, ``known_hosts``, ``vagrant``) may start with ``~`` and are relative to
the inventory file's directory. There is no password key, on purpose: passwords are not
kept in files; SSH keys (or an agent) are the only way in.

Which file: ``--inventory FILE``, else ``$ASTRAL_INVENTORY``, else ``machines.yaml`` in the
current directory. Every name and path that reaches a remote command line is checked here
against a conservative pattern, so that no inventory can smuggle shell syntax into one (the
commands are quoted with ``shlex.join`` anyway: this is the second fence).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from orchestrator.remote.vagrant import SshConfig, ssh_config
from topologies.errors import InventoryError
from topologies.yamlfile import read_yaml

ENV_VAR = "ASTRAL_INVENTORY"
DEFAULT_FILE = Path("machines.yaml")
DEFAULT_PROJECT = "astral-testbed"

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
HOST = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.:-]{0,252}$")  # DNS names, IPv4, IPv6
USER = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}$")
REMOTE_PATH = re.compile(r"^[A-Za-z0-9._/+-]+$")
# ... and none of these: a '..' part, a leading '-' (an option), '/' or the home itself
REMOTE_PATH_REFUSED = re.compile(r"(?:^|/)\.\.(?:/|$)|^-|^/*\.?/*$")
PORT_RANGE = (1, 65535)
LOCAL_PATH = re.compile(r"^[^\x00]+$")  # a path on this machine: anything but NUL
VAGRANT_GIVES = ("host", "port", "user", "key")  # not beside `vagrant:`
NAME_TEXT = "letters, digits, '.', '_' and '-', at most 64, not starting with punctuation"
HOST_TEXT = "a host name or address (letters, digits, '.', ':', '-')"
USER_TEXT = "a user name (letters, digits, '_', '.', '-', at most 32)"
_PORT_TEXT = f"a port between {PORT_RANGE[0]} and {PORT_RANGE[1]}"

TOP_KEYS = {"machines"}
MACHINE_KEYS = {
    "host", "port", "user", "key", "project", "known_hosts", "sudo", "timeouts",
    "vagrant", "vagrant_machine",
}  # fmt: skip
TIMEOUT_KEYS = {"connect", "idle", "command"}


@dataclass(frozen=True)
class Timeouts:
    """Seconds: ``connect`` to reach the machine, authenticate and open a session; ``idle``
    for any answer from it once connected (a silent network is a lost one); ``command`` for
    one command there to finish (setup, a run), after which it is stopped there."""

    connect: float = 15.0
    idle: float = 60.0
    command: float = 6 * 3600.0


@dataclass(frozen=True)
class Endpoint:
    """Where and as whom to log in, once a Vagrant machine has been asked."""

    host: str
    port: int
    user: str
    key_file: Path | None

    @property
    def address(self) -> str:
        return f"{self.user}@{self.host}:{self.port}"


@dataclass(frozen=True)
class Machine:
    """One machine of the inventory, validated."""

    name: str
    source: Path  # the inventory file, for messages
    project: str  # the checkout there (POSIX path; relative = under the login's home)
    known_hosts: Path
    timeouts: Timeouts
    host: str | None = None
    port: int = 22
    user: str = "root"
    key_file: Path | None = None
    sudo: bool | None = None  # None: when the user is not root
    vagrant: Path | None = None
    vagrant_machine: str | None = None

    def endpoint(self) -> Endpoint:
        """Address, port, user and key: the inventory's, or ``vagrant ssh-config``'s."""
        if self.vagrant is None:
            assert self.host is not None
            return Endpoint(self.host, self.port, self.user, self.key_file)
        config = ssh_config(self.vagrant, self.vagrant_machine)
        return endpoint_from_vagrant(config, self)

    def uses_sudo(self, endpoint: Endpoint) -> bool:
        return self.sudo if self.sudo is not None else endpoint.user != "root"


def endpoint_from_vagrant(config: SshConfig, machine: Machine) -> Endpoint:
    """The endpoint Vagrant described, checked like an inventory's own values (its output
    reaches command lines and file names too)."""
    where = f"'vagrant ssh-config' in {machine.vagrant}"
    if not HOST.match(config.host):
        raise InventoryError(where, "HostName", HOST_TEXT, config.host)
    if not USER.match(config.user):
        raise InventoryError(where, "User", USER_TEXT, config.user)
    if not PORT_RANGE[0] <= config.port <= PORT_RANGE[1]:
        raise InventoryError(where, "Port", _PORT_TEXT, config.port)
    return Endpoint(config.host, config.port, config.user, config.key_file)


@dataclass(frozen=True)
class Inventory:
    source: Path
    machines: Mapping[str, Machine]

    def machine(self, name: str) -> Machine:
        if name not in self.machines:
            known = ", ".join(sorted(self.machines)) or "none"
            raise InventoryError(
                self.source, f"machines.{name}", f"a machine it lists ({known})", "no such machine"
            )
        return self.machines[name]


def inventory_path(given: Path | None) -> Path:
    """The inventory file: the command line's, the environment's, or the default."""
    if given is not None:
        return given
    from_env = os.environ.get(ENV_VAR)
    return Path(from_env) if from_env else DEFAULT_FILE


def load_inventory(path: Path) -> Inventory:
    document = read_yaml(path, InventoryError, "inventory (machines.yaml, docs/remote.md)")
    return parse_inventory(document, path)


def parse_inventory(document: object, source: Path) -> Inventory:
    read = _Reader(source)
    top = read.mapping(document, "", TOP_KEYS)
    if "machines" not in top:
        read.fail("machines", "a mapping of machine names to machines", "nothing")
    machines = read.mapping(top["machines"], "machines", None)
    parsed = {}
    for name, value in machines.items():
        if not isinstance(name, str) or not NAME.match(name):
            read.fail(f"machines.{name}", "a machine name: " + NAME_TEXT, name)
        parsed[name] = _machine(read, name, value)
    return Inventory(source, parsed)


def _machine(read: _Reader, name: str, value: object) -> Machine:
    key = f"machines.{name}"
    if isinstance(value, Mapping) and "password" in value:
        read.fail(
            f"{key}.password",
            "no password: passwords are never read from files; give 'key: FILE' "
            "(or load the key into ssh-agent)",
            "a password",
        )
    doc = read.mapping(value, key, MACHINE_KEYS)
    base = read.source.parent
    vagrant = doc.get("vagrant")
    if vagrant is not None:
        for other in VAGRANT_GIVES:
            if other in doc:
                read.fail(
                    f"{key}.{other}",
                    "no host, port, user or key beside 'vagrant' (vagrant ssh-config gives them)",
                    doc[other],
                )
        directory = read.local_path(vagrant, f"{key}.vagrant", base)
        known_default = directory / ".vagrant" / "known_hosts"
    elif "host" not in doc:
        read.fail(f"{key}.host", "a host name or address (or 'vagrant: DIR')", "nothing")
    else:
        directory = None
        known_default = Path("~/.ssh/known_hosts").expanduser()
    vagrant_machine = doc.get("vagrant_machine")
    if vagrant_machine is not None:
        if vagrant is None:
            read.fail(f"{key}.vagrant_machine", "'vagrant: DIR' beside it", "no vagrant key")
        read.pattern(
            vagrant_machine, f"{key}.vagrant_machine", NAME, "a Vagrant machine name: " + NAME_TEXT
        )
    sudo = doc.get("sudo")
    if sudo is not None and not isinstance(sudo, bool):
        read.fail(f"{key}.sudo", "true or false", sudo)
    project = doc.get("project", DEFAULT_PROJECT)
    return Machine(
        name=name,
        source=read.source,
        host=read.pattern(doc["host"], f"{key}.host", HOST, HOST_TEXT) if "host" in doc else None,
        port=read.port(doc.get("port", 22), f"{key}.port"),
        user=read.pattern(doc.get("user", "root"), f"{key}.user", USER, USER_TEXT),
        key_file=read.local_path(doc["key"], f"{key}.key", base) if "key" in doc else None,
        project=read.remote_path(project, f"{key}.project"),
        known_hosts=read.local_path(doc["known_hosts"], f"{key}.known_hosts", base)
        if "known_hosts" in doc
        else known_default,
        sudo=sudo,
        timeouts=read.timeouts(doc.get("timeouts", {}), f"{key}.timeouts"),
        vagrant=directory,
        vagrant_machine=vagrant_machine,
    )


def _describe(value: object) -> str:
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return repr(value)


class _Reader:
    """Walks the parsed inventory, raising InventoryError with file and key path."""

    def __init__(self, source: Path) -> None:
        self.source = source

    def fail(self, key: str, expected: str, found: object = None) -> None:
        raise InventoryError(self.source, key, expected, found)

    def mapping(self, value: object, key: str, allowed: set[str] | None) -> Mapping[str, Any]:
        if not isinstance(value, Mapping):
            self.fail(key, "a mapping", _describe(value))
        assert isinstance(value, Mapping)
        for name in value:
            if allowed is not None and name not in allowed:
                path = f"{key}.{name}" if key else str(name)
                self.fail(path, "one of the keys " + ", ".join(sorted(allowed)), "unknown key")
        return value

    def pattern(self, value: object, key: str, pattern: re.Pattern[str], what: str) -> str:
        if not isinstance(value, str) or not pattern.match(value):
            self.fail(key, what, value)
        assert isinstance(value, str)
        return value

    def port(self, value: object, key: str) -> int:
        if (
            isinstance(value, bool)
            or not isinstance(value, int)
            or not PORT_RANGE[0] <= value <= PORT_RANGE[1]
        ):
            self.fail(key, _PORT_TEXT, value)
        assert isinstance(value, int)
        return value

    def local_path(self, value: object, key: str, base: Path) -> Path:
        if not isinstance(value, str) or not LOCAL_PATH.match(value):
            self.fail(key, "a path on this machine", value)
        assert isinstance(value, str)
        path = Path(value).expanduser()
        return path if path.is_absolute() else base / path

    def remote_path(self, value: object, key: str) -> str:
        """A path there: absolute or relative to the login's home, without ``..`` and of
        plain characters, since it reaches command lines and SFTP."""
        what = "a path there, absolute or relative to the login's home"
        self.pattern(value, key, REMOTE_PATH, f"{what}, of letters, digits and . _ / + -")
        assert isinstance(value, str)
        if REMOTE_PATH_REFUSED.search(value):
            self.fail(key, f"{what}, without '..', not '/' or the home itself", value)
        return str(PurePosixPath(value))

    def timeouts(self, value: object, key: str) -> Timeouts:
        doc = self.mapping(value, key, TIMEOUT_KEYS)
        default = Timeouts()
        seconds = {}
        for name in TIMEOUT_KEYS:
            given = doc.get(name, getattr(default, name))
            if isinstance(given, bool) or not isinstance(given, (int, float)) or given <= 0:
                self.fail(f"{key}.{name}", "a number of seconds > 0", given)
            seconds[name] = float(given)
        return Timeouts(**seconds)
