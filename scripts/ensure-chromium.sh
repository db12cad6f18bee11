#!/usr/bin/env bash
# The report test opens report.html in a real browser: Debian/Ubuntu's chromium, headless.
# Exit 0 when chromium is there (or was installed); 3 when it can't be installed here (the test then
# skips locally and fails in CI).
set -euo pipefail
command -v chromium >/dev/null 2>&1 && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "chromium missing: installing it from the distribution's archive ..."
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null || true
  apt-get install -y -qq --no-install-recommends chromium >/dev/null || true
  command -v chromium >/dev/null 2>&1 && exit 0
fi
echo "chromium not available: install it (apt-get install chromium) to run the report browser test" >&2
exit 3
