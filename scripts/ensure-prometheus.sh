#!/usr/bin/env bash
# Make sure Debian's Prometheus (the server and promtool) is installed: tests start their own
# server on a loopback port and check deploy/prometheus/ with promtool. Nothing is left
# running: the package's own service is stopped and disabled if its install started it.
set -euo pipefail

if command -v prometheus >/dev/null && command -v promtool >/dev/null; then
  exit 0
fi
echo "ensure-prometheus: installing prometheus with apt" >&2
sudo_cmd=""
[ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
$sudo_cmd apt-get update -qq
# RUNLEVEL=1 keeps invoke-rc.d from starting the packaged service where there is no systemd.
RUNLEVEL=1 DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq \
  --no-install-recommends prometheus >/dev/null
if command -v systemctl >/dev/null && systemctl is-active --quiet prometheus 2>/dev/null; then
  $sudo_cmd systemctl disable --now prometheus >/dev/null 2>&1 || true
fi
command -v prometheus >/dev/null && command -v promtool >/dev/null
