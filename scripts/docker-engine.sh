#!/usr/bin/env bash
# A Docker engine for the container tests, on a machine that may have none (CI): Debian's docker.io,
# its daemon started with --bridge=none --iptables=false (containers use host networking), and a base
# image made with debootstrap (no image registry needed), tagged zkc-base:bookworm.
#   scripts/docker-engine.sh start   # idempotent; uses an engine that already answers and starts nothing then
#   scripts/docker-engine.sh stop    # stops, by its pid, only a daemon this script started
#   scripts/docker-engine.sh status
set -euo pipefail
PIDFILE=/var/run/zkc-dockerd.pid
LOG=/var/log/zkc-dockerd.log
CACHE=${ZKC_DOCKER_CACHE:-/var/cache/zkc}
BASE_TAG=${ZKC_BASE_IMAGE:-zkc-base:bookworm}
MIRROR=${ZKC_DEBIAN_MIRROR:-http://deb.debian.org/debian}

answers() { docker info >/dev/null 2>&1; }

start() {
    if ! answers; then
        if [ "$(id -u)" != 0 ]; then echo "no Docker engine answers, and starting one needs root" >&2; exit 1; fi
        if ! command -v dockerd >/dev/null; then
            apt-get update -qq
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker.io debootstrap docker-compose >/dev/null
        fi
        dockerd --bridge=none --iptables=false --ip6tables=false --pidfile "$PIDFILE" >"$LOG" 2>&1 &
        for _ in $(seq 1 60); do answers && break; sleep 0.5; done
        answers || { echo "dockerd did not start; see $LOG" >&2; exit 1; }
        echo "dockerd started (pid $(cat "$PIDFILE"))"
    fi
    command -v docker-compose >/dev/null || { [ "$(id -u)" = 0 ] && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker-compose >/dev/null || true; }
    if ! docker image inspect "$BASE_TAG" >/dev/null 2>&1; then
        command -v debootstrap >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
        mkdir -p "$CACHE"
        if [ ! -s "$CACHE/bookworm-minbase.tar" ]; then
            rm -rf "$CACHE/rootfs"
            debootstrap --variant=minbase bookworm "$CACHE/rootfs" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1 \
                || { echo "debootstrap failed; see $CACHE/debootstrap.log" >&2; exit 1; }
            tar -C "$CACHE/rootfs" -cf "$CACHE/bookworm-minbase.tar" .
            rm -rf "$CACHE/rootfs"
        fi
        docker import "$CACHE/bookworm-minbase.tar" "$BASE_TAG" >/dev/null
        echo "base image $BASE_TAG imported"
    fi
}

stop() {
    if [ -s "$PIDFILE" ]; then
        pid=$(cat "$PIDFILE")
        if kill -0 "$pid" 2>/dev/null; then
            kill "$pid"
            for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
            kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
            echo "dockerd (pid $pid) stopped"
        fi
        rm -f "$PIDFILE"
    fi
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) answers && echo "a Docker engine answers" || { echo "no Docker engine answers"; exit 1; } ;;
    *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
