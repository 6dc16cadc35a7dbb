#!/usr/bin/env bash
# Install PostgreSQL's server programs (Debian) for the two-drivers-on-PostgreSQL test
# (tests/test_lease.py starts its own throwaway server on 127.0.0.1). Without them that test skips.
set -u
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && ! command -v initdb >/dev/null 2>&1; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql) \
        >/tmp/apt-postgres.log 2>&1 || echo "postgres: install failed (see /tmp/apt-postgres.log); its test will skip"
fi
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1
