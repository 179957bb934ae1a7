#!/usr/bin/env bash
# Make sure Debian's Chromium and ChromeDriver are installed, for the browser tests
# (tests/browser/). They drive /usr/bin/chromium through /usr/bin/chromedriver, never a
# downloaded browser.
set -euo pipefail
if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
  exit 0
fi
echo "ensure-chromium: installing chromium and chromium-driver with apt" >&2
sudo_cmd=""
[ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
$sudo_cmd apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq chromium chromium-driver >/dev/null
chromium --version >&2
