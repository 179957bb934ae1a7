#!/usr/bin/env bash
# Make sure redis-server is installed (tests start their own instances of it) and, unless
# --installed is given, that a Redis server answers on $REDIS_HOST:$REDIS_PORT (default
# 127.0.0.1:6379), starting one if none does (make bench-cache).
set -euo pipefail
host=${REDIS_HOST:-127.0.0.1}
port=${REDIS_PORT:-6379}

ping() {
  exec 3<>"/dev/tcp/$host/$port" 2>/dev/null || return 1
  printf 'PING\r\n' >&3
  local reply=""
  read -r -t 2 reply <&3 || true
  exec 3>&- 3<&-
  [[ $reply == +PONG* ]]
}

if ! command -v redis-server >/dev/null; then
  echo "ensure-redis: installing redis-server with apt" >&2
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq redis-server >/dev/null
fi
[ "${1:-}" = --installed ] && exit 0
ping && exit 0
echo "ensure-redis: starting redis-server on $host:$port" >&2
redis-server --daemonize yes --bind "$host" --port "$port" --save "" --appendonly no \
  --logfile "${TMPDIR:-/tmp}/sluicegate-redis.log"
for _ in $(seq 50); do
  ping && exit 0
  sleep 0.1
done
echo "ensure-redis: redis-server did not answer on $host:$port" >&2
exit 1
