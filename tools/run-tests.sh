#!/bin/bash
# Run the whole vmar-openstack test suite on a fresh Debian 12 machine (as
# root): installs what it needs, then runs style checks, unit tests and the
# functional tests against real QEMU tools, SQLite, MariaDB and PostgreSQL.
set -euo pipefail

TOP=$(cd "$(dirname "$0")/.." && pwd)
cd "$TOP"
VENV=$(tools/install-deps.sh --test | tail -n 1)
export PATH="$VENV/bin:$PATH"

echo "== style: flake8 (hacking), shellcheck, bashate"
flake8
tools/lint-shell.sh

echo "== release notes"
reno lint >/dev/null

echo "== config sample is up to date"
tools/gen-config.sh --check

echo "== unit tests"
stestr --test-path=./tests/unit run

echo "== functional tests (real QEMU tools, SQLite, MariaDB, PostgreSQL)"
stestr --test-path=./tests/functional run --concurrency=1
