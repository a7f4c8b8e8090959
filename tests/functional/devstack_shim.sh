#!/bin/bash
#
# A shim of the devstack functions and variables the vmar-openstack plugin
# uses, for tests/functional/test_devstack.py. It is NOT devstack: no git
# clones, no apt, no systemd, no keystone. Each function follows the
# documented behaviour of its devstack namesake (functions-common,
# inc/ini-config, inc/python, lib/database, lib/rpc_backend, lib/nova) in
# what the plugin relies on, and records what cannot really be done here.
#
# Usage (as root):
#   SHIM_ROOT=/tmp/x VMAR_DIR=/path/to/vmar-openstack ...
#   source devstack_shim.sh
#   shim_run_plugin stack post-config
#
# Variables the caller may set: SHIM_ROOT (required), VMAR_DIR, and any
# devstack variable below. SHIM_RECORD_ONLY: services whose run_process is
# recorded but not executed (n-cpu: nova-compute cannot run without a
# control plane).
#
# Records, under $SHIM_ROOT/shim:
#   packages       one line per package given to install_package
#   develop        one line per setup_develop/pip_install call
#   process.log    "start <service> <command>" / "stop <service>" events
#   flavors/NAME   the arguments of "openstack flavor create ... NAME"
#   openstack.log  every openstack call
# and $SERVICE_DIR/<service>.pid (running services), <service>.cmd (the
# last command, group and user given to run_process), $LOGDIR/<service>.log.

SHIM_ROOT=${SHIM_ROOT:?SHIM_ROOT must be set}
SHIM_RECORD_ONLY=${SHIM_RECORD_ONLY:-}
SHIM_STOP_TIMEOUT=${SHIM_STOP_TIMEOUT:-60}
SHIM_RECORDS=$SHIM_ROOT/shim
mkdir -p "$SHIM_RECORDS/flavors"


# Variables devstack sets before it runs plugins
# ---------------------------------------------

DEST=${DEST:-$SHIM_ROOT/opt/stack}
DATA_DIR=${DATA_DIR:-$DEST/data}
SERVICE_DIR=${SERVICE_DIR:-$DEST/status}
LOGDIR=${LOGDIR:-$DEST/logs}
TOP_DIR=${TOP_DIR:-$DEST/devstack}
STACK_USER=${STACK_USER:-$(id -un)}
GLOBAL_VENV=${GLOBAL_VENV:-True}
DEVSTACK_VENV=${DEVSTACK_VENV:-$DEST/data/venv}
DEVSTACK_PLUGINS=${DEVSTACK_PLUGINS:-vmar-openstack}
ENABLED_SERVICES=${ENABLED_SERVICES:-rabbit,mysql,key,g-api,placement-api,n-api,n-cond,n-sch,n-cpu}
DISABLED_SERVICES=${DISABLED_SERVICES:-}
REGION_NAME=${REGION_NAME:-RegionOne}
# stackrc: the node's address (get_default_host_ip), and the controller's
HOST_IP=${HOST_IP:-127.0.0.1}
SERVICE_HOST=${SERVICE_HOST:-$HOST_IP}
KEYSTONE_SERVICE_URI=${KEYSTONE_SERVICE_URI:-http://$SERVICE_HOST/identity}
SERVICE_PASSWORD=${SERVICE_PASSWORD:-shim-service-password}
SERVICE_PROJECT_NAME=${SERVICE_PROJECT_NAME:-service}
SERVICE_DOMAIN_NAME=${SERVICE_DOMAIN_NAME:-Default}
RABBIT_USERID=${RABBIT_USERID:-stackrabbit}
RABBIT_PASSWORD=${RABBIT_PASSWORD:-shim-rabbit-password}
RABBIT_HOST=${RABBIT_HOST:-$SERVICE_HOST}
# Not a devstack database type: a SQLite file per database (see below).
DATABASE_TYPE=${DATABASE_TYPE:-sqlite}
# The database services lib/database registers (register_database).
DATABASE_BACKENDS=${DATABASE_BACKENDS:-mysql postgresql}
SHIM_DB_DIR=${SHIM_DB_DIR:-$SHIM_ROOT/databases}
VIRT_DRIVER=${VIRT_DRIVER:-libvirt}
LIBVIRT_GROUP=${LIBVIRT_GROUP:-libvirt}
NOVA_BIN_DIR=${NOVA_BIN_DIR:-$DEVSTACK_VENV/bin}
NOVA_CONF_DIR=${NOVA_CONF_DIR:-$SHIM_ROOT/etc/nova}
NOVA_CONF=${NOVA_CONF:-$NOVA_CONF_DIR/nova.conf}
NOVA_CPU_CONF=${NOVA_CPU_CONF:-$NOVA_CONF_DIR/nova-cpu.conf}
# lib/nova's uWSGI file of nova-api, written before post-config
NOVA_UWSGI_CONF=${NOVA_UWSGI_CONF:-$NOVA_CONF_DIR/nova-api-uwsgi.ini}
GLANCE_CONF_DIR=${GLANCE_CONF_DIR:-$SHIM_ROOT/etc/glance}
GLANCE_API_CONF=${GLANCE_API_CONF:-$GLANCE_CONF_DIR/glance-api.conf}
GLANCE_IMAGE_IMPORT_CONF=${GLANCE_IMAGE_IMPORT_CONF:-$GLANCE_CONF_DIR/glance-image-import.conf}
export OS_CLOUD=${OS_CLOUD:-devstack-admin}

mkdir -p "$SERVICE_DIR" "$LOGDIR" "$SHIM_DB_DIR"

# devstack runs as a user with sudo; CI runs this shim as root, often
# without sudo installed.
if ! command -v sudo > /dev/null; then
    if [[ $(id -u) != 0 ]]; then
        echo "devstack_shim: not root and no sudo" >&2
        exit 1
    fi
    function sudo {
        "$@"
    }
fi


# Messages (functions-common)
# --------

# die $LINENO "message": print, exit 1 (or the failing status).
function die {
    local exitcode=$?
    local line=$1
    shift
    if [[ $exitcode == 0 ]]; then
        exitcode=1
    fi
    echo "[ERROR] ${BASH_SOURCE[1]}:$line $*" >&2
    exit $exitcode
}

function err {
    local line=$1
    shift
    echo "[ERROR] ${BASH_SOURCE[1]}:$line $*" >&2
}

function warn {
    local line=$1
    shift
    echo "WARNING: ${BASH_SOURCE[1]}:$line $*" >&2
}

function echo_summary {
    echo "$@"
}

# trueorfalse default varname: the normalised boolean value of $varname.
function trueorfalse {
    local default=$1
    local value=${!2:-}
    case ${value,,} in
        1|yes|true|on) echo True ;;
        0|no|false|off) echo False ;;
        "") echo "$default" ;;
        *) die $LINENO "trueorfalse: unknown value '$value' of $2" ;;
    esac
}


# Plugins and services (functions-common)
# --------------------

function define_plugin {
    :
}

function plugin_requires {
    :
}

function is_plugin_enabled {
    [[ ,$DEVSTACK_PLUGINS, == *,$1,* ]]
}

# is_service_enabled service [service ...]: OR of the services, with the
# catch-all names nova (n-*) and glance (g-*) and is_<service>_enabled.
function is_service_enabled {
    local service
    for service in "$@"; do
        if [[ ,$ENABLED_SERVICES, == *,$service,* ]]; then
            return 0
        fi
        if declare -F "is_${service}_enabled" > /dev/null &&
            "is_${service}_enabled"; then
            return 0
        fi
        case $service in
            nova) [[ ,$ENABLED_SERVICES == *,n-* ]] && return 0 ;;
            glance) [[ ,$ENABLED_SERVICES == *,g-* ]] && return 0 ;;
        esac
    done
    return 1
}

function enable_service {
    local service
    for service in "$@"; do
        if [[ ,$DISABLED_SERVICES, == *,$service,* ]]; then
            warn $LINENO "Attempt to enable_service $service when it has" \
                "been disabled"
            continue
        fi
        if ! is_service_enabled "$service"; then
            ENABLED_SERVICES+=",$service"
        fi
    done
    ENABLED_SERVICES=${ENABLED_SERVICES#,}
}


# INI files (inc/ini-config)
# ---------

# iniset [-sudo] file section option value: replace the option's value in
# the section, else add "option = value" just after the section header;
# a missing section is appended (after a blank line) and a missing file is
# created. Devstack's iniset also escapes & and \ for its sed; awk needs
# no escaping here.
function iniset {
    [[ $1 == -sudo ]] && shift
    local file=$1 section=$2 option=$3 value=$4 tmp
    # As devstack: the value goes through an unquoted echo.
    # shellcheck disable=SC2086,SC2116
    value=$(echo $value)
    if [[ -z $section || -z $option ]]; then
        return
    fi
    if ! grep -q "^\[$section\]" "$file" 2> /dev/null; then
        printf '\n[%s]\n' "$section" >> "$file"
    fi
    tmp=$(mktemp)
    SECTION=$section OPTION=$option VALUE=$value awk '
        function is_option(line,   rest) {
            if (index(line, ENVIRON["OPTION"]) != 1) return 0
            rest = substr(line, length(ENVIRON["OPTION"]) + 1)
            return rest ~ /^[ \t]*=/
        }
        { lines[NR] = $0 }
        END {
            header = "[" ENVIRON["SECTION"] "]"
            insec = 0; found = 0
            for (i = 1; i <= NR; i++) {
                l = lines[i]
                if (index(l, header) == 1) insec = 1
                else if (l ~ /^\[.*\]/) insec = 0
                if (insec && is_option(l)) {
                    match(l, /^[^=]*=[ \t]*/)
                    lines[i] = substr(l, 1, RLENGTH) ENVIRON["VALUE"]
                    found = 1
                }
            }
            for (i = 1; i <= NR; i++) {
                print lines[i]
                if (!found && index(lines[i], header) == 1)
                    print ENVIRON["OPTION"] " = " ENVIRON["VALUE"]
            }
        }' "$file" > "$tmp"
    cat "$tmp" > "$file"
    rm -f "$tmp"
}

# Print lines "option = value" of a section (the devstack sed range: from
# the header to the next header).
function _shim_ini_lines {
    local file=$1 section=$2 option=$3
    SECTION=$section OPTION=$option awk '
        index($0, "[" ENVIRON["SECTION"] "]") == 1 { insec = 1; next }
        /^\[.*\]/ { insec = 0 }
        insec && index($0, ENVIRON["OPTION"]) == 1 &&
            substr($0, length(ENVIRON["OPTION"]) + 1) ~ /^[ \t]*=/' "$file"
}

# iniget file section option: the value after the first "=", through an
# unquoted echo as in devstack: whitespace collapsed, and pathname
# expansion applies (a caller that needs none runs it under set -f).
function iniget {
    local file=$1 section=$2 option=$3 line
    line=$(_shim_ini_lines "$file" "$section" "$option")
    # shellcheck disable=SC2086
    echo ${line#*=}
}

function ini_has_option {
    [[ $1 == -sudo ]] && shift
    [[ -n $(_shim_ini_lines "$1" "$2" "$3") ]]
}

# inidelete [-sudo] file section option: remove the option's lines.
function inidelete {
    [[ $1 == -sudo ]] && shift
    local file=$1 section=$2 option=$3 tmp
    if [[ -z $section || -z $option ]]; then
        return
    fi
    tmp=$(mktemp)
    SECTION=$section OPTION=$option awk '
        index($0, "[" ENVIRON["SECTION"] "]") == 1 { insec = 1 }
        /^\[.*\]/ && index($0, "[" ENVIRON["SECTION"] "]") != 1 { insec = 0 }
        insec && index($0, ENVIRON["OPTION"]) == 1 &&
            substr($0, length(ENVIRON["OPTION"]) + 1) ~ /^[ \t]*=/ { next }
        { print }' "$file" > "$tmp"
    cat "$tmp" > "$file"
    rm -f "$tmp"
}


# Packages (functions-common, inc/python)
# --------

# install_package package...: devstack runs apt-get install. The shim
# records the packages and fails unless they are already installed.
function install_package {
    local p status missing=()
    for p in "$@"; do
        echo "$p" >> "$SHIM_RECORDS/packages"
        status=$(dpkg-query -W -f='${Status}' "$p" 2> /dev/null || true)
        if [[ $status != "install ok installed" ]]; then
            missing+=("$p")
        fi
    done
    if [[ ${#missing[@]} -gt 0 ]]; then
        die $LINENO "shim: not installed (the shim runs no apt):" \
            "${missing[*]}"
    fi
}

# install_bindep file [profile...]: devstack installs the packages bindep
# lists as missing. The shim records the call and fails unless bindep (from
# the test virtualenv) finds nothing missing.
function install_bindep {
    local missing
    echo "$*" >> "$SHIM_RECORDS/bindep"
    if ! missing=$(bindep -b -f "$@"); then
        die $LINENO "shim: not installed (the shim runs no apt): ${missing//$'\n'/ }"
    fi
}

function is_package_installed {
    dpkg -s "$@" > /dev/null 2>&1
}

# setup_develop [-bindep] project_dir [extras]: devstack pip installs -e;
# the shim records it and checks the project is a Python project (it is
# already installed in the test's virtualenv).
function setup_develop {
    [[ $1 == -bindep* ]] && shift
    if [[ ! -f $1/setup.cfg ]]; then
        die $LINENO "shim: setup_develop: $1 is not a Python project"
    fi
    echo "setup_develop $*" >> "$SHIM_RECORDS/develop"
}

function pip_install {
    echo "pip_install $*" >> "$SHIM_RECORDS/develop"
}

function get_python_exec_prefix {
    if [[ $GLOBAL_VENV == True ]]; then
        echo "$DEVSTACK_VENV/bin"
    else
        echo /usr/local/bin
    fi
}


# Databases (lib/database)
# ---------

# recreate_database name / database_connection_url name dispatch on
# $DATABASE_TYPE as devstack does; the shim's type is sqlite.
function recreate_database {
    "recreate_database_$DATABASE_TYPE" "$1"
}

function database_connection_url {
    "database_connection_url_$DATABASE_TYPE" "$1"
}

function recreate_database_sqlite {
    rm -f "$SHIM_DB_DIR/$1.sqlite"
    : > "$SHIM_DB_DIR/$1.sqlite"
}

function database_connection_url_sqlite {
    echo "sqlite:///$SHIM_DB_DIR/$1.sqlite"
}

function drop_database_sqlite {
    rm -f "$SHIM_DB_DIR/$1.sqlite"
}


# Messaging (lib/rpc_backend)
# ---------

# shellcheck disable=SC2120
function get_transport_url {
    if is_service_enabled rabbit || [[ -n $RABBIT_HOST && -n $RABBIT_PASSWORD ]]
    then
        echo "rabbit://$RABBIT_USERID:$RABBIT_PASSWORD@$RABBIT_HOST:5672/$1"
    fi
}

# shellcheck disable=SC2120
function get_notification_url {
    if is_service_enabled rabbit || [[ -n $RABBIT_HOST && -n $RABBIT_PASSWORD ]]
    then
        echo "rabbit://$RABBIT_USERID:$RABBIT_PASSWORD@$RABBIT_HOST:5672/$1"
    fi
}


# Processes (functions-common)
# ---------
#
# devstack runs each service as the systemd unit devstack@<service>: User=
# (default $STACK_USER), Group=, Environment=PATH=..., KillMode=process.
# Without systemd the shim does what devstack did before systemd: the
# command runs in the background under setsid, its pid in
# $SERVICE_DIR/<service>.pid and its output in $LOGDIR/<service>.log.

# Whether a pid is a live process (a zombie is not: the shell that started
# a service has exited, and whoever inherited it may reap it late).
function _shim_alive {
    local stat
    stat=$(cat "/proc/$1/stat" 2> /dev/null) || return 1
    stat=${stat##*) }
    [[ ${stat%% *} != Z ]]
}

function _shim_running {
    local pid_file=$SERVICE_DIR/$1.pid
    [[ -r $pid_file ]] && _shim_alive "$(cat "$pid_file")"
}

# run_process service "command" [group] [user] [env_vars]
function run_process {
    local service=$1 command=$2 group=${3:-} user=${4:-} env_vars=${5:-}
    local -a argv run_as=() envs=()
    if ! is_service_enabled "$service"; then
        return 0
    fi
    # devstack's _common_systemd_pitfalls
    if [[ $command =~ sudo ]]; then
        die $LINENO "run_process $service: sudo in the command"
    fi
    if [[ ! $command =~ ^/ ]]; then
        die $LINENO "run_process $service: '$command' is not absolute"
    fi
    user=${user:-$STACK_USER}
    printf 'command=%s\ngroup=%s\nuser=%s\nenv=%s\n' "$command" "$group" \
        "$user" "$env_vars" > "$SERVICE_DIR/$service.cmd"
    if [[ ,$SHIM_RECORD_ONLY, == *,$service,* ]]; then
        printf 'start %s %s\n' "$service" "$command" \
            >> "$SHIM_RECORDS/process.log"
        : > "$SERVICE_DIR/$service.recorded"
        return 0
    fi
    # "systemctl start" of a running unit does nothing.
    if _shim_running "$service"; then
        return 0
    fi
    if [[ $user != $(id -un) ]]; then
        run_as=(runuser -u "$user" --)
    fi
    if [[ -n $group ]]; then
        # As devstack did before systemd: sg runs the command in the group.
        if [[ ${#run_as[@]} -gt 0 ]]; then
            die $LINENO "shim: run_process with both a group and a user"
        fi
        run_as=(sg "$group" -c)
        command="exec $command"
    fi
    read -r -a envs <<< "$env_vars"
    if [[ -n $group ]]; then
        argv=("$command")
    else
        read -r -a argv <<< "$command"
    fi
    printf 'start %s %s\n' "$service" "$2" >> "$SHIM_RECORDS/process.log"
    # Not a job-control shell: the child is no group leader, so setsid
    # does not fork and $! is the service's pid.
    (
        cd / || exit 1
        exec setsid env -i PATH="$PATH" HOME=/root LANG=C.UTF-8 \
            "${envs[@]}" "${run_as[@]}" "${argv[@]}"
    ) >> "$LOGDIR/$service.log" 2>&1 < /dev/null &
    echo $! > "$SERVICE_DIR/$service.pid"
}

# stop_process service: as "systemctl stop" of a KillMode=process unit:
# SIGTERM to the main process only, SIGKILL after the stop timeout.
function stop_process {
    local service=$1 pid_file=$SERVICE_DIR/$1.pid pid i
    if ! is_service_enabled "$service"; then
        return 0
    fi
    if [[ -e $SERVICE_DIR/$service.recorded ]]; then
        rm -f "$SERVICE_DIR/$service.recorded"
        printf 'stop %s\n' "$service" >> "$SHIM_RECORDS/process.log"
        return 0
    fi
    if [[ ! -r $pid_file ]]; then
        return 0
    fi
    pid=$(cat "$pid_file")
    printf 'stop %s\n' "$service" >> "$SHIM_RECORDS/process.log"
    if kill -TERM "$pid" 2> /dev/null; then
        for ((i = 0; i < SHIM_STOP_TIMEOUT * 10; i++)); do
            _shim_alive "$pid" || break
            sleep 0.1
        done
        kill -KILL "$pid" 2> /dev/null || true
    fi
    # Reap it if this shell started it.
    wait "$pid" 2> /dev/null || true
    rm -f "$pid_file"
}


# The OpenStack client
# --------------------

# openstack [--os-*...] flavor show|create|list ...: flavors live in
# $SHIM_RECORDS/flavors; anything else fails.
function openstack {
    echo "$*" >> "$SHIM_RECORDS/openstack.log"
    while [[ $# -gt 0 && $1 == --os-* ]]; do
        if [[ $1 == *=* ]]; then
            shift
        else
            shift 2
        fi
    done
    case "$1 $2" in
        "flavor show")
            if [[ -f $SHIM_RECORDS/flavors/$3 ]]; then
                echo "name $3"
                cat "$SHIM_RECORDS/flavors/$3"
                return 0
            fi
            echo "No Flavor found for $3" >&2
            return 1
            ;;
        "flavor create")
            shift 2
            local name=${!#}
            if [[ -f $SHIM_RECORDS/flavors/$name ]]; then
                echo "Flavor with name $name already exists" >&2
                return 1
            fi
            printf '%s\n' "$@" > "$SHIM_RECORDS/flavors/$name"
            echo "created $name"
            ;;
        "flavor list")
            ls "$SHIM_RECORDS/flavors"
            ;;
        *)
            die $LINENO "shim: openstack $* is not supported"
            ;;
    esac
}


# What devstack does around the plugin
# ------------------------------------

# load_plugin_settings + run_plugins for this one plugin: the settings,
# then plugin.sh sourced with the mode and phase.
function shim_run_plugin {
    # shellcheck source=devstack/settings
    source "$VMAR_DIR/devstack/settings"
    # shellcheck source=devstack/plugin.sh
    source "$VMAR_DIR/devstack/plugin.sh" "$@"
}

# lib/nova start_nova_compute, for libvirt: $NOVA_CPU_CONF is a copy of
# $NOVA_CONF, and n-cpu runs nova-compute in the libvirt group.
function start_nova_compute {
    cp "$NOVA_CONF" "$NOVA_CPU_CONF"
    run_process n-cpu \
        "$NOVA_BIN_DIR/nova-compute --config-file $NOVA_CPU_CONF" \
        "$LIBVIRT_GROUP"
}
