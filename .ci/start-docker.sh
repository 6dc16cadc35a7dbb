#!/usr/bin/env bash
# Start a Docker Engine for the Docker backend tests (installs docker.io + busybox-static if missing).
# Usage: start-docker.sh [PIDFILE]: the PID of a dockerd started here goes to PIDFILE (default
# /tmp/dockerd.pid); an engine that was already running is left alone and no PID is written.
set -u
pidfile=${1:-/tmp/dockerd.pid}
if ! command -v dockerd >/dev/null 2>&1 || ! command -v busybox >/dev/null 2>&1; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io busybox-static) \
        >/tmp/apt-docker.log 2>&1 || echo "docker: install failed (see /tmp/apt-docker.log); Docker tests will skip"
fi
if command -v dockerd >/dev/null 2>&1 && ! docker info >/dev/null 2>&1; then
    nohup dockerd >/tmp/dockerd.log 2>&1 &
    echo $! >"$pidfile"
    for _ in $(seq 1 60); do
        docker info >/dev/null 2>&1 && break
        sleep 0.5
    done
    docker info >/dev/null 2>&1 || echo "docker: dockerd did not come up (see /tmp/dockerd.log); Docker tests will skip"
fi
docker info >/dev/null 2>&1
