#!/usr/bin/env bash
# Stop the dockerd that start-docker.sh started (only that one: by its PID).
set -u
if [ -f /tmp/dockerd.pid ]; then
    kill "$(cat /tmp/dockerd.pid)" 2>/dev/null || true
    rm -f /tmp/dockerd.pid
fi
