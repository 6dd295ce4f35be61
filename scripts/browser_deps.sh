#!/bin/sh
# Debian's headless Chromium and ChromeDriver for tests/e2e/test_docs_browser.py (/v2/docs in a real browser).
# Installs them when missing and this machine allows it (root, apt-get); otherwise says that the browser test
# will be skipped.  Never a browser download of its own: Debian's packages only.
set -u
if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then
    exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "fastoip: installing Debian's chromium and chromium-driver for the /v2/docs browser test"
    if apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver; then
        exit 0
    fi
    echo "fastoip: apt-get could not install chromium and chromium-driver"
fi
echo "fastoip: Chromium or ChromeDriver not found: tests/e2e/test_docs_browser.py will be skipped" \
     "(install Debian's chromium and chromium-driver to run it)"
exit 0
