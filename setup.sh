#!/usr/bin/env bash
# Set up everything astral-testbed needs, then optionally run something.
#
#   sudo ./setup.sh                 set up only
#   sudo ./setup.sh run [ARGS...]   set up, then run the default experiment
#   sudo ./setup.sh test [ARGS...]  set up, then the whole test suite: the unit tests on every
#                                   CPU, then the integration tests (with ARGS: one pytest
#                                   run with them instead)
#
# Works on a fresh Debian 12 or Ubuntu 22.04+ machine, with or without systemd, and is
# idempotent: a second run installs nothing and takes a few seconds. Steps:
#   1. apt packages (apt-get update only when one is missing)
#   2. Open vSwitch daemons running (ovs-ctl without systemd, systemctl with it)
#   3. userspace TSO enabled (restarts ovs-vswitchd only when the setting changed)
#   4. .venv made with the system python3 and `pip install -e '.[dev]'` (only when the
#      project is not importable from it or pyproject.toml changed since the last install)
# Why each dependency is needed: docs/dependencies.md.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)"
VENV="$REPO/.venv"
STAMP="$VENV/.astral-setup-stamp"
SYSTEM_PYTHON=/usr/bin/python3 # the distribution's, never pyenv's: it must match apt's mnexec
OVS_CTL=/usr/share/openvswitch/scripts/ovs-ctl
OVS_LOG="${OVS_LOGDIR:-/var/log/openvswitch}/ovs-vswitchd.log"
TSO_LOG_LINE="Userspace TCP Segmentation Offloading support enabled"
APT_PACKAGES=(
    mininet openvswitch-switch iperf3 ethtool iproute2 iputils-ping
    python3-venv python3-pip openssh-server openssh-client procps nftables
)

say() { printf 'setup: %s\n' "$*"; }
die() {
    printf 'setup: error: %s\n' "$*" >&2
    exit 1
}

usage() {
    sed -n '2,7s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"
}

case "${1:-}" in
    "" | run | test) ;;
    -h | --help | help)
        usage
        exit 0
        ;;
    *)
        usage >&2
        exit 2
        ;;
esac
[[ $EUID -eq 0 ]] || die "needs root (apt, Open vSwitch, Mininet): sudo $0 $*"
cd "$REPO"
started=$SECONDS

# 1. System packages ---------------------------------------------------------------------
missing=()
for package in "${APT_PACKAGES[@]}"; do
    status="$(dpkg-query -W -f='${db:Status-Status}' "$package" 2>/dev/null || true)"
    [[ $status == installed ]] || missing+=("$package")
done
if ((${#missing[@]})); then
    command -v apt-get >/dev/null || die "missing ${missing[*]}, and no apt-get: use Debian or Ubuntu"
    say "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
    say "apt packages: all ${#APT_PACKAGES[@]} present"
fi

# 2. Open vSwitch daemons -------------------------------------------------------------
# Running = the process in its pid file is alive. A busy ovs-vswitchd (hundreds of bridges,
# two cores) can take seconds to answer, which is not the same as not running.
OVS_RUNDIR="${OVS_RUNDIR:-/var/run/openvswitch}"
alive() { [[ -r $OVS_RUNDIR/$1.pid ]] && kill -0 "$(cat "$OVS_RUNDIR/$1.pid")" 2>/dev/null; }
ovs_running() { alive ovsdb-server && alive ovs-vswitchd; }
# `ovs-vsctl show` reaches ovsdb-server only; ovs-appctl reaches ovs-vswitchd itself.
ovs_answers() {
    ovs-vsctl --timeout=20 show >/dev/null &&
        ovs-appctl --timeout=20 -t ovs-vswitchd version >/dev/null
}
with_systemd() { [[ -d /run/systemd/system ]]; }

if ovs_running; then
    say "Open vSwitch: running"
else
    say "starting Open vSwitch"
    if with_systemd; then
        systemctl start openvswitch-switch
    else
        # Idempotent: starts whichever of ovsdb-server/ovs-vswitchd is not running. The
        # "ulimit: error setting limit" it may print in containers is harmless.
        "$OVS_CTL" start --system-id=random
    fi
    ovs_running || die "Open vSwitch did not start; see $OVS_LOG"
fi
ovs_answers || die "Open vSwitch runs but does not answer; see $OVS_LOG"

# 3. Userspace TSO ----------------------------------------------------------------------
# Without it TCP over the userspace datapath (used where the openvswitch kernel module is
# missing) runs about 9x slower (docs/dependencies.md). It does nothing for the
# kernel datapath. ovs-vswitchd applies it to ports opened after it reads the setting, so
# restart it once to apply it to every port; ovsdb-server and the flows stay (ovs-ctl saves
# and restores them).
tso="$(ovs-vsctl --timeout=20 --if-exists get Open_vSwitch . other_config:userspace-tso-enable)"
if [[ ${tso//\"/} == true ]]; then
    say "userspace TSO: enabled"
else
    say "enabling userspace TSO (restarts ovs-vswitchd once)"
    log_size=0
    [[ -r $OVS_LOG ]] && log_size="$(stat -c %s "$OVS_LOG")"
    ovs-vsctl --timeout=20 set Open_vSwitch . other_config:userspace-tso-enable=true
    if with_systemd && systemctl is-active --quiet ovs-vswitchd.service; then
        systemctl restart ovs-vswitchd.service
    else
        "$OVS_CTL" --no-ovsdb-server restart
    fi
    ovs_running && ovs_answers || die "ovs-vswitchd did not come back after the restart; see $OVS_LOG"
    # What the restarted ovs-vswitchd logged (read whole: `tail | grep -q` under pipefail
    # can fail with SIGPIPE even when grep finds the line).
    logged_tso() { grep -qF "$TSO_LOG_LINE" <(tail -c +"$((log_size + 1))" "$OVS_LOG"); }
    if [[ -r $OVS_LOG ]]; then
        for _ in $(seq 50); do
            logged_tso && break
            sleep 0.2
        done
        logged_tso || die "ovs-vswitchd restarted without enabling userspace TSO; see $OVS_LOG"
        say "userspace TSO: active (confirmed in $OVS_LOG)"
    else
        say "userspace TSO: set, but $OVS_LOG is not readable to confirm it"
    fi
fi

# 4. Python environment -----------------------------------------------------------------
[[ -x $SYSTEM_PYTHON ]] || die "$SYSTEM_PYTHON is missing (apt-get install python3)"
want="$(sha256sum pyproject.toml | cut -d' ' -f1) $("$SYSTEM_PYTHON" -V 2>&1)"
have="$(cat "$STAMP" 2>/dev/null || true)"
# The project counts as installed when this checkout (not another one) is what imports.
project_importable() {
    "$VENV/bin/python" -c "import os, sys, orchestrator.cli as m; \
sys.exit(not os.path.realpath(m.__file__).startswith(sys.argv[1] + '/'))" "$REPO" 2>/dev/null
}
why="pyproject.toml changed or the project is not installed"
if [[ ! -x $VENV/bin/python ]] || ! "$VENV/bin/python" -c '' 2>/dev/null; then
    say "creating $VENV with $SYSTEM_PYTHON ($("$SYSTEM_PYTHON" -V 2>&1))"
    "$SYSTEM_PYTHON" -m venv --clear "$VENV"
    have=""
    why="new environment: a minute or two"
fi
if [[ $have == "$want" ]] && project_importable; then
    say "Python environment: up to date"
else
    say "pip install -e '.[dev]' into .venv ($why)"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e '.[dev]'
    project_importable || die "the project is not importable from $VENV after pip install"
    printf '%s\n' "$want" >"$STAMP"
fi
say "ready in $((SECONDS - started)) s"

# 5. What to run --------------------------------------------------------------------------
command="${1:-}"
(($#)) && shift
case "$command" in
    run)
        # `astral run` with no experiment runs experiments/default.yaml (astral-small,
        # all-reduce + all-to-all, ecmp vs path-pinned). The fallback only matters in a
        # checkout too old to have `astral run`.
        if "$VENV/bin/astral" run --help >/dev/null 2>&1; then
            exec "$VENV/bin/astral" run "$@"
        fi
        say "'astral run' is not there yet: running 'astral topo show' instead"
        exec "$VENV/bin/astral" topo show "$@"
        ;;
    test)
        if (($#)); then
            exec "$VENV/bin/python" -m pytest "$@"
        fi
        # The whole suite, in two passes: the unit tests spread over the CPUs
        # (pytest-xdist), then the integration tests one at a time, since they share the
        # machine's run lock and must not take the CPUs their emulated links run on.
        status=0
        "$VENV/bin/python" -m pytest -n auto -m "not integration" || status=$?
        case "$status" in
            0 | 1)
                # 1 (a unit test failed): the integration tests still run, so that one
                # CI run reports both; 2 (interrupted) or worse: stop here
                "$VENV/bin/python" -m pytest -m integration || {
                    second=$?
                    ((status)) || status=$second
                }
                ;;
        esac
        exit "$status"
        ;;
esac
