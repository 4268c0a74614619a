"""Policy options: ``--policy NAME:key=value,key=value`` (values are strings until parsed).

The registry (``controllers.policies.PolicyRegistry.create``) splits the options off and
passes them to the policy's factory as keyword arguments; a policy parses its own values
with the helpers here and raises ValueError for a bad one (the registry turns both an
unknown option and a bad value into a ConfigError).
"""

from __future__ import annotations

TRUE = frozenset({"1", "on", "true", "yes"})
FALSE = frozenset({"0", "off", "false", "no"})


def split_policy(spec: str) -> tuple[str, dict[str, str]]:
    """``"ecmp:fast_failover=off"`` -> ``("ecmp", {"fast_failover": "off"})``."""
    name, _, rest = spec.partition(":")
    options: dict[str, str] = {}
    for item in filter(None, rest.split(",")):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"policy option {item!r} is not key=value")
        options[key.strip().replace("-", "_")] = value.strip()
    return name.strip(), options


def flag(name: str, value: str | bool) -> bool:
    if isinstance(value, bool):
        return value
    if value.lower() in TRUE:
        return True
    if value.lower() in FALSE:
        return False
    raise ValueError(f"option {name} must be on or off, not {value!r}")


def integer(name: str, value: str | int) -> int:
    try:
        return int(value, 0) if isinstance(value, str) else int(value)
    except ValueError:
        raise ValueError(f"option {name} must be an integer, not {value!r}") from None
