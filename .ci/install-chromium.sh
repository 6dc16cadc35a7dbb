#!/usr/bin/env bash
# Install headless Chromium for the browser tests (tests/test_dashboard_browser.py), from Debian.
# Usage: install-chromium.sh. Without it those tests skip and say why; a failed install does too.
set -u
if ! command -v chromium >/dev/null 2>&1; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) \
        >/tmp/apt-chromium.log 2>&1 || echo "chromium: install failed (see /tmp/apt-chromium.log); browser tests will skip"
fi
command -v chromium >/dev/null 2>&1
