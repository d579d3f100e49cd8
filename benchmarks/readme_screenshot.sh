#!/bin/sh
# docs/report-screenshot.png, the README's picture of the HTML report: `profkit diff` of the committed sample
# pair, drawn in headless Chromium 900 px wide (the narrow layout the tests check), its top 2,150 px at 0.8
# scale (720 x 1720). Run from the checkout's root: sh benchmarks/readme_screenshot.sh
set -e
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python -m profkit diff traces/sample/eager_sync.pt.trace.json.gz traces/sample/graph_decode.pt.trace.json.gz --html "$tmp/diff.html" > /dev/null 2>&1
chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --virtual-time-budget=8000 --force-device-scale-factor=0.8 \
  --window-size=900,2150 --screenshot="$PWD/docs/report-screenshot.png" "file://$tmp/diff.html" 2> /dev/null
