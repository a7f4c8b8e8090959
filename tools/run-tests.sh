#!/bin/bash
# Run the whole vmar-openstack test suite on a fresh Debian 12 machine (as
# root): installs what it needs, then runs style checks, unit tests, the
# functional tests against real QEMU tools, libvirt, SQLite, MariaDB,
# PostgreSQL, RabbitMQ, glance-api and a single-node Ceph, and beside them
# stages that share nothing with those tests: the daemon's tests on the
# other QEMUs (10.0) then the library's on MariaDB, PostgreSQL and Galera,
# the all-in-one cloud's user path
# (tests/functional/test_cloud.py) and the fresh-machine stage:
# the README's demo command in a pristine Debian 12 root
# (tools/fresh-root.sh), then the packages of the vmar QEMU tools
# (qemu/build.sh --deb) installed with apt alone in another
# (tools/package-check.sh).
#
# Usage: tools/run-tests.sh [--no-fresh-root] [--full] [--multinode]
#                            [--upstream-qemu] [--bench]
#   --no-fresh-root  skip the fresh-machine stage (CI always runs it)
#   --full           the heavier parts CI's run leaves out to stay within
#                    its bounds: the daemon's whole functional suite on the
#                    other QEMUs (test_ceph, test_peers and Glance's lazy
#                    hosts besides test_export and test_mirror: 55 tests,
#                    17-32 minutes beside the others on two cores) and the
#                    cloud's user path with every lifecycle operation
#                    (tools/cloud_scenario.py's lifecycle_images: hard
#                    reboot, rebuild, a plain server of a snapshot, a cold
#                    snapshot saved whole; about 6 minutes more)
#   --bench          also the paper's experiment, reduced, after the cloud's
#                    user path (bench/bench_boot.py --reduced: every
#                    configuration, real TCG boots; about 13 minutes on two
#                    cores beside the other tests, so not in CI's run)
#   --upstream-qemu  also build the newest upstream QEMU (qemu/build.sh
#                    --qemu 10.2) and run the daemon's tests on it (about 3
#                    minutes to build on two cores, 6 to test)
#   --multinode      also the moves between three compute hosts
#                    (tests/functional/test_multinode.py: tools/cloud.sh up
#                    --computes 3; about 15 minutes on two cores, so not in
#                    CI's run)
#
# Servers the tests start (MariaDB, PostgreSQL, libvirtd, virtlogd) are
# stopped when the run ends; servers that were already running are left
# alone.
set -euo pipefail

TOP=$(cd "$(dirname "$0")/.." && pwd)
cd "$TOP"
FRESH_ROOT=1
FULL=0
MULTINODE=0
UPSTREAM_QEMU=0
BENCH=0
for arg in "$@"; do
    case $arg in
        --no-fresh-root) FRESH_ROOT=0 ;;
        --full) FULL=1 ;;
        --multinode) MULTINODE=1 ;;
        --upstream-qemu) UPSTREAM_QEMU=1 ;;
        --bench) BENCH=1 ;;
        *) echo "usage: $0 [--no-fresh-root] [--full] [--multinode]" \
            "[--upstream-qemu] [--bench]" >&2; exit 2 ;;
    esac
done
if [ "$FRESH_ROOT" = 0 ] && [ -n "${CI:-}" ]; then
    echo "CI runs the fresh-machine stage; ignoring --no-fresh-root" >&2
    FRESH_ROOT=1
fi
VENV=$(tools/install-deps.sh test cloud | tail -n 1)
export PATH="$VENV/bin:$PATH"

VMAR_TEST_STARTED=$(mktemp /tmp/vmar-test-started.XXXXXX)
export VMAR_TEST_STARTED
stop_started() {
    python3 -m tools.vmarenv.services stop "$VMAR_TEST_STARTED" || true
}

# Each stage line says how busy the machine's cores were since the one
# before (of any chain): the run is bound by the cores when it stays near
# 100 %.
cpu_ticks() {
    # busy (user nice system irq softirq steal) and all (with idle, iowait)
    awk '/^cpu /{ b = $2+$3+$4+$7+$8+$9; print b, b+$5+$6 }' /proc/stat
}
stage() {
    local busy total state=${STAGE_CPU:-/dev/null}
    read -r busy total < <(cpu_ticks)
    local last=(0 0)
    [ -s "$state" ] && read -r -a last <"$state"
    printf '== %s (%s' "$1" "$(date +%H:%M:%S)"
    if [ "${last[1]}" != 0 ] && [ "$total" -gt "${last[1]}" ]; then
        printf '; cores %d %% busy since the last stage' \
            $(( 100 * (busy - last[0]) / (total - last[1]) ))
    fi
    printf ')\n'
    [ "$state" = /dev/null ] || echo "$busy $total" >"$state"
}
# cpu_used WHAT: the CPU time (user and system) a chain's processes used,
# itself and every child it waited for (bash's times)
cpu_used() {
    # (times in this shell: in a $(...) it would time the subshell)
    local f
    f=$(mktemp /tmp/vmar-times.XXXXXX)
    times >"$f"
    echo "$1: CPU used (user, system): $(tail -n 1 "$f")"
    rm -f "$f"
}
STAGE_CPU=$(mktemp /tmp/vmar-stage-cpu.XXXXXX)
trap 'stop_started; rm -f "$STAGE_CPU"' EXIT

stage "style: flake8 (hacking), shellcheck, bashate"
flake8
tools/lint-shell.sh

stage "release notes"
reno lint >/dev/null

stage "config sample is up to date"
tools/gen-config.sh --check

stage "docs: Sphinx, warnings as errors (tox -e docs)"
sphinx-build -W --keep-going -q -b html -d doc/build/doctrees doc/source \
    doc/build/html

# The image library (debootstrap, mostly downloads and dpkg) and the test
# guest are built beside the unit tests and the QEMU builds, which use the
# cores; on a fresh machine that hides most of its 9 minutes. Nothing
# before the functional tests reads them.
VMAR_IMAGE_LIBRARY=${VMAR_IMAGE_LIBRARY:-/var/cache/vmar-openstack/images}
export VMAR_IMAGE_LIBRARY
if [ "$FRESH_ROOT" = 1 ]; then
    # the fresh-machine stage's root installs the mirror's newest tools:
    # images built with those are the root's too, and it builds none
    stage "image tools at the mirror's versions (for the fresh root)"
    tools/build-image-library.sh --upgrade-tools
fi
stage "Debian image library and test guest (cached): started"
LIBRARY_LOG=$(mktemp /tmp/vmar-image-library.XXXXXX)
{
    tools/build-image-library.sh "$VMAR_IMAGE_LIBRARY" &&
        tools/build-test-guest.sh | tail -n 1
} >"$LIBRARY_LOG" 2>&1 &
LIBRARY_PID=$!

stage "unit tests"
stestr --test-path=./tests/unit run


# The product runs on Debian 12's QEMU 7.2; the daemon's tests run again
# on Debian 13's 10.0 (and with --upstream-qemu on the newest upstream).
stage "patched QEMU 7.2 and 10.0 (qemu/build.sh; cached by content hash)"
VMAR_QEMU_PREFIX=$(qemu/build.sh --qemu 7.2 --deb | tail -n 1)
export VMAR_QEMU_PREFIX
echo "$VMAR_QEMU_PREFIX"
OTHER_QEMUS=("$(qemu/build.sh --qemu 10.0 --deb | tail -n 1)")
if [ "$UPSTREAM_QEMU" = 1 ]; then
    OTHER_QEMUS+=("$(qemu/build.sh --qemu 10.2 | tail -n 1)")
fi
printf '%s\n' "${OTHER_QEMUS[@]}"

stage "qemu-iotests of the vmar drivers, on each QEMU"
for prefix in "$VMAR_QEMU_PREFIX" "${OTHER_QEMUS[@]}"; do
    qemu/run-iotests.sh "$prefix"
done

stage "Debian image library and test guest: waiting"
library=0
wait "$LIBRARY_PID" || library=$?
cat "$LIBRARY_LOG"
rm -f "$LIBRARY_LOG"
if [ "$library" != 0 ]; then
    echo "image library or test guest: exit status $library" >&2
    exit "$library"
fi

# The fresh-machine stage runs beside the functional tests: it is mostly
# downloads, installs and a cached build, and shares nothing with the tests
# but the caches keyed by content (and the disk's read-ahead knob, which
# both take turns at through its flock). Its output is printed after them.
if [ "$FRESH_ROOT" = 1 ]; then
    stage "fresh machine: tools/demo.sh in a pristine root, started"
    FRESH_LOG=$(mktemp /tmp/vmar-fresh-root.XXXXXX)
    # then the packages of the vmar QEMU tools, installed with apt alone in
    # another pristine root, and vmar-export serve from each
    DEBS=("$VMAR_QEMU_PREFIX"/*.deb "${OTHER_QEMUS[0]}"/*.deb)
    ADD=()
    IN_ROOT=()
    for deb in "${DEBS[@]}"; do
        ADD+=(--add "$deb")
        IN_ROOT+=("/root/${deb##*/}")
    done
    {
        tools/fresh-root.sh tools/demo.sh &&
            tools/fresh-root.sh "${ADD[@]}" tools/package-check.sh \
                "${IN_ROOT[@]}"
    } >"$FRESH_LOG" 2>&1 &
    FRESH_PID=$!
fi

# The tests that run qemu-storage-daemon's vmar graph, run again on the other
# QEMUs: exports and mirrors; with --full also Glance's lazy hosts and fills,
# Ceph and the peer server's TLS clients (the qemu-iotests of the drivers
# ran on every QEMU above)
DAEMON_TESTS='^tests\.functional\.(test_export|test_mirror)\.'
if [ "$FULL" = 1 ]; then
    DAEMON_TESTS='^tests\.functional\.(test_export|test_mirror|test_ceph|test_peers)\.'
    DAEMON_TESTS+='|^tests\.functional\.test_glance\..*\.test_lazy_'
    # the user path's every step (tests/functional/test_cloud.py)
    export VMAR_CLOUD_ALL_STEPS=1
fi
# The library's tests on the database servers (MariaDB, PostgreSQL, Galera)
# run no QEMU: they follow the other QEMUs' tests in that chain, which ends
# long before the functional tests' (the longest chain) would reach them
DATABASE_TESTS='^tests\.functional\.(test_databases|test_galera|test_scale)\.'
CLOUD_TEST=tests.functional.test_cloud
# stestr's "failing" names the failures of its last run only: each run's
# are kept, with the QEMU they ran on, for the summary at the end
FAILED=$(mktemp /tmp/vmar-failed.XXXXXX)
FAILED_DETAILS=$(mktemp /tmp/vmar-failed-details.XXXXXX)
# failed WHAT [STESTR-OPTION...]: keep the failures of the last run
failed() {
    local what=$1
    shift
    stestr "$@" --test-path=./tests/functional failing --list 2>/dev/null |
        sed "s|\$| ($what)|" >>"$FAILED" || true
    # what CI keeps of a run is its end: each failure's last traceback lines
    stestr "$@" --test-path=./tests/functional failing 2>/dev/null |
        awk -v qemu="$what" '
            function flush() {
                if (name == "") return
                print "-- " name " (" qemu ")"
                for (i = (n > 12 ? n - 11 : 1); i <= n; i++) print "   " tb[i]
            }
            /^(FAIL|ERROR): / { flush(); name = $2; n = 0; intb = 0; next }
            /^Traceback \(most recent call last\)/ { intb = 1; n = 0 }
            /^(=+|-+|Ran [0-9]+ tests)/ { intb = 0 }
            intb { tb[++n] = $0 }
            END { flush() }' >>"$FAILED_DETAILS" || true
}
qemu_version() {
    sed -n 's/^qemu-version //p' "$1/BUILDINFO" 2>/dev/null || echo "$1"
}

# Three chains run side by side and share nothing. The functional tests
# (below) and the cloud's user path (this first one) take about the same
# time and most of a core each; the daemon's tests on the other QEMUs (the
# second one) wait on their services more than they compute (9 minutes
# with the machine to themselves, half a core busy), so they run beside
# both at a lower priority (nice 5) and take what the other two leave;
# then that chain runs the library's tests on the database servers, taken
# off the functional tests' chain (the longest: 34 minutes with them, of
# which they were 8, on an Intel Xeon of two cores), and the unit tests on
# Nova 33, taken off the cloud's chain (it ended last, 4 minutes later
# for them).
#
# The first: the all-in-one cloud's user path
# (tests/functional/test_cloud.py, the longest test), then with --bench the
# paper's experiment, reduced (bench/bench_boot.py --reduced: every
# configuration, 3 servers of 2 images at 1 arrival/s; it must run to its
# report, no figure is asserted; the full run is behind bench/REPORT.md).
# The cloud has its own state directory, ports, database, broker and
# libvirtd (in a mount namespace), and the experiment its own QEMUs and
# nbdkit. The second's services take free ports and directories of their
# own, and its MariaDB and PostgreSQL databases are named apart
# (VMAR_TEST_DATABASE). Their output is printed after the functional tests'.
SIDE_LOG=$(mktemp /tmp/vmar-side-chain.XXXXXX)
SIDE_STATUS=$(mktemp /tmp/vmar-side-status.XXXXXX)
side_chain() {
    local cloud=0 bench=0
    stage "the cloud's user path ($CLOUD_TEST)"
    python3 -m testtools.run "$CLOUD_TEST" || cloud=$?
    echo "$CLOUD_TEST: exit status $cloud"
    if [ "$BENCH" = 1 ]; then
        stage "bench_boot.py --reduced (the paper's experiment, small)"
        python3 bench/bench_boot.py --qemu-prefix "$VMAR_QEMU_PREFIX" \
            --reduced --out bench/out/boot-reduced \
            --report bench/out/boot-reduced/REPORT.md || bench=$?
        echo "bench_boot.py --reduced: exit status $bench"
    fi
    cpu_used "the chain of the cloud's user path"
    echo "$cloud $bench" >"$SIDE_STATUS"
}
# stestr_repo DIR STESTR...: a chain's own stestr repository in DIR
# (chains running at once must not write one), made the first time;
# STESTR... is the stestr command to make it with.
stestr_repo() {
    local repo=$1
    shift
    [ -d "$repo/.stestr" ] || { mkdir -p "$repo" &&
        "$@" --repo-url "$repo" init >/dev/null; }
}
OTHER_LOG=$(mktemp /tmp/vmar-other-qemus.XXXXXX)
OTHER_STATUS=$(mktemp /tmp/vmar-other-status.XXXXXX)
other_qemus_chain() {
    local status=0 prefix version repo="$TOP/.stestr-other-qemus"
    stestr_repo "$repo" stestr
    for prefix in "${OTHER_QEMUS[@]}"; do
        version=$(qemu_version "$prefix")
        stage "the daemon's functional tests on $version"
        VMAR_QEMU_PREFIX=$prefix VMAR_TEST_DATABASE=vmar_test_other \
            nice -n 5 stestr --repo-url "$repo" \
            --test-path=./tests/functional run --concurrency=1 \
            "$DAEMON_TESTS" || {
            status=$?
            failed "QEMU $version" --repo-url "$repo"
        }
    done
    stage "the library's tests on the database servers"
    VMAR_TEST_DATABASE=vmar_test_other \
        stestr --repo-url "$repo" --test-path=./tests/functional run \
        --concurrency=1 "$DATABASE_TESTS" || {
        status=$?
        failed "database servers" --repo-url "$repo"
    }
    # Operators run the release before the newest too: the same unit
    # tests (the wrapped methods' signatures among them) against Nova 33's
    # classes. (Here, not before the cloud: that chain ends last.)
    stage "unit tests on Nova 33 (.venv-nova33)"
    local unit=0 venv nova33_repo="$TOP/.stestr-nova33"
    venv=$(VMAR_VENV="$TOP/.venv-nova33" tools/install-deps.sh nova33 |
        tail -n 1) &&
        stestr_repo "$nova33_repo" "$venv/bin/python" -m stestr &&
        "$venv/bin/python" -m stestr --repo-url "$nova33_repo" \
            --test-path=./tests/unit run || unit=$?
    echo "unit tests on Nova 33: exit status $unit"
    cpu_used "the chain of the other QEMUs', the database servers' and \
Nova 33's tests"
    echo "$status $unit" >"$OTHER_STATUS"
}
mkdir -p bench/out
stage "the cloud's user path (then with --bench bench_boot.py): started"
side_chain >"$SIDE_LOG" 2>&1 &
SIDE_PID=$!
stage "the daemon's tests on the other QEMUs: started"
other_qemus_chain >"$OTHER_LOG" 2>&1 &
OTHER_PID=$!

stage "functional tests (QEMU, libvirt, SQLite, MariaDB, PostgreSQL, Ceph)"
tests_status=0
stestr --test-path=./tests/functional run --concurrency=1 \
    --exclude-regex "^${CLOUD_TEST//./\\.}\\.|$DATABASE_TESTS" || {
    tests_status=$?
    failed "QEMU $(qemu_version "$VMAR_QEMU_PREFIX")"
}
if [ "$MULTINODE" = 1 ]; then
    stage "multinode: every move between three compute hosts"
    VMAR_MULTINODE=1 stestr --test-path=./tests/functional run \
        --concurrency=1 test_multinode || {
        tests_status=$?
        failed multinode
    }
fi

# before any other chain is waited for: setup and the functional tests
cpu_used "setup and the functional tests"
stage "the daemon's tests on the other QEMUs: waiting"
wait "$OTHER_PID" || true
cat "$OTHER_LOG"
rm -f "$OTHER_LOG"
read -r other_status nova33_status <"$OTHER_STATUS" || {
    other_status=1 nova33_status=1
}
rm -f "$OTHER_STATUS"
[ "$other_status" = 0 ] || tests_status=$other_status

stage "the cloud's user path: waiting"
wait "$SIDE_PID" || true
stop_started
cat "$SIDE_LOG"
rm -f "$SIDE_LOG"
read -r cloud_status bench_status <"$SIDE_STATUS" || {
    cloud_status=1 bench_status=1
}
rm -f "$SIDE_STATUS"
[ "$cloud_status" = 0 ] || tests_status=$cloud_status

fresh=0
if [ "$FRESH_ROOT" = 1 ]; then
    stage "fresh machine: waiting for tools/fresh-root.sh tools/demo.sh"
    wait "$FRESH_PID" || fresh=$?
    cat "$FRESH_LOG"
    rm -f "$FRESH_LOG"
    echo "fresh-machine stage: exit status $fresh"
fi
# The fresh-machine log is long: repeat what failed last, where a reader
# of the end of the output finds it.
if [ "$tests_status" != 0 ]; then
    stage "functional tests that failed (details above)"
    cat "$FAILED_DETAILS"
    cat "$FAILED"
    [ "$cloud_status" = 0 ] || echo "$CLOUD_TEST"
fi
rm -f "$FAILED" "$FAILED_DETAILS"
stage "done"
[ "$tests_status" = 0 ] && [ "$fresh" = 0 ] && [ "$bench_status" = 0 ] &&
    [ "$nova33_status" = 0 ]
