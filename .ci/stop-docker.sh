#!/usr/bin/env bash
# Stop the dockerd that start-docker.sh started (only that one: by the PID it wrote to PIDFILE).
# Usage: stop-docker.sh [PIDFILE] (default /tmp/dockerd.pid)
set -u
pidfile=${1:-/tmp/dockerd.pid}
if [ -s "$pidfile" ]; then
    kill "$(cat "$pidfile")" 2>/dev/null || true
fi
rm -f "$pidfile"
