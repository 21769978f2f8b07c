#!/usr/bin/env bash
# What the browser tests (tests/browser) need on a fresh Debian machine: Debian's Chromium and
# a font for it to draw text with, and Playwright for Python to drive it. Playwright's own
# browser download is never used (the tests launch /usr/bin/chromium).
# Idempotent: each step is skipped when its piece is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -x /usr/bin/chromium ] && fc-list 2>/dev/null | grep -qi liberation; then
  echo "browser-deps: $(/usr/bin/chromium --version 2>/dev/null || echo chromium) already installed"
else
  if [ "$(id -u)" -ne 0 ]; then
    echo "browser-deps: chromium is missing and this is not root: apt-get install chromium" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q chromium fonts-liberation
  echo "browser-deps: installed $(/usr/bin/chromium --version 2>/dev/null || echo chromium)"
fi

if ! python -c "import playwright.async_api" 2>/dev/null; then
  # Normally there already: playwright is in the project's [test] extra.
  python -m pip install -q --disable-pip-version-check "playwright>=1.44"
fi
