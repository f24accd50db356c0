#!/usr/bin/env bash
# Make sure headless Chromium and its WebDriver (Debian packages `chromium`, `chromium-driver`)
# are installed, and print the two paths (browser, driver) on one line each. Quick when they are
# present; otherwise installs them with apt-get (needs root, as in CI). The browser tests drive
# them with Selenium.
set -euo pipefail

find_pair() {
    local browser driver
    browser=${HALTWISE_CHROMIUM:-$(command -v chromium || true)}
    driver=${HALTWISE_CHROMEDRIVER:-$(command -v chromedriver || true)}
    if [ -n "$browser" ] && [ -x "$browser" ] && [ -n "$driver" ] && [ -x "$driver" ]; then
        echo "$browser"
        echo "$driver"
        return 0
    fi
    return 1
}

if find_pair; then
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "ensure-chromium: chromium and chromedriver not found, and installing them needs root:" >&2
    echo "  sudo apt-get install -y chromium chromium-driver" >&2
    exit 1
fi

echo "ensure-chromium: installing chromium and chromium-driver (apt-get)..." >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update >&2
apt-get install -y --no-install-recommends chromium chromium-driver >&2

if ! find_pair; then
    echo "ensure-chromium: chromium-driver installed but chromium/chromedriver still not found" >&2
    exit 1
fi
