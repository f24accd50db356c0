#!/usr/bin/env bash
# Make sure the PostgreSQL server binaries (initdb, pg_ctl, postgres) are installed, and print
# the directory that holds them. Quick when they are present; otherwise installs the Debian
# package `postgresql` (needs root, as in CI). The tests start their own throwaway server.
set -euo pipefail

find_bin_dir() {
    local dir
    for dir in ${HALTWISE_PG_BIN:-} $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -rV) \
               $(pg_config --bindir 2>/dev/null || true); do
        if [ -x "$dir/initdb" ] && [ -x "$dir/pg_ctl" ] && [ -x "$dir/postgres" ]; then
            echo "$dir"
            return 0
        fi
    done
    return 1
}

if bin_dir=$(find_bin_dir); then
    echo "$bin_dir"
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "ensure-postgres: PostgreSQL server binaries not found, and installing them needs root:" >&2
    echo "  sudo apt-get install -y postgresql   (or set HALTWISE_PG_BIN)" >&2
    exit 1
fi

echo "ensure-postgres: installing PostgreSQL (apt-get)..." >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update >&2
apt-get install -y --no-install-recommends postgresql >&2

if ! bin_dir=$(find_bin_dir); then
    echo "ensure-postgres: postgresql installed but initdb/pg_ctl/postgres still not found" >&2
    exit 1
fi
echo "$bin_dir"
