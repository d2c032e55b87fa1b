#!/usr/bin/env bash
# dashboard.sh - the server's dashboard (GET /) in headless Chromium after a few requests: the
# page runs without errors (none in its error line, no uncaught exception in the browser's log),
# names the routing it drew, and its screenshot's heat map is not empty (colored pixels where
# the canvas is). Skipped (77) without chromium or libmicrohttpd.
#   bash tests/cli/dashboard.sh HOTMOE_BIN TMPDIR      (run from the repository root)
set -u
bin=$1
tmp=$2/dashboard_sh
mkdir -p "$tmp"
. "$(dirname "${BASH_SOURCE[0]}")/common.bash"
chrome=$(command -v chromium || command -v chromium-browser || true)
[ -n "$chrome" ] || { echo "dashboard.sh: skipped (no chromium)"; exit 77; }

m=$tmp/q.gguf
"$bin" forge --preset tiny-qwen3moe --type q8_0 --no-hf -q -o "$m" || bad "forge"
serve_start "$bin" "$tmp/err" -m "$m" -t 2
expect "serve: listening" test -n "$port"
for i in 1 2 3; do
  python3 -c "import sys,urllib.request; urllib.request.urlopen(urllib.request.Request('http://127.0.0.1:$port/v1/completions', data=b'{\"prompt\": \"hi $i\", \"max_tokens\": 16}')).read()"
done
flags=(--headless=new --no-sandbox --disable-gpu --virtual-time-budget=5000 --window-size=1200,900
       --user-data-dir="$tmp/profile" --enable-logging=stderr --v=0)
timeout 120 "$chrome" "${flags[@]}" --dump-dom "http://127.0.0.1:$port/" >"$tmp/dom.html" 2>"$tmp/chrome.log"
expect "chromium: the page loaded" grep -q 'id="heat"' "$tmp/dom.html"
expect "the page drew the routing of the requests" grep -Eq '4 layers, 16 experts, [1-9][0-9]* tokens routed' "$tmp/dom.html"
expect "no error on the page" grep -q '<div id="err"></div>' "$tmp/dom.html"
expect "no uncaught exception in the browser's log" sh -c "! grep -qi 'uncaught' '$tmp/chrome.log'"
timeout 120 "$chrome" "${flags[@]}" --screenshot="$tmp/shot.png" "http://127.0.0.1:$port/" >/dev/null 2>&1
python3 - "$tmp/shot.png" "$tmp/dom.html" <<'PY'
import struct, sys, zlib
# decode the PNG (8-bit RGB or RGBA, not interlaced) and count colored pixels where the heat map
# is drawn: the canvas starts below the first box (x 20-500, y 120-260 at 1200 x 900)
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n"
pos, idat, w = 8, b"", 0
while pos < len(data):
    n, kind = struct.unpack(">I4s", data[pos:pos + 8])
    body = data[pos + 8:pos + 8 + n]
    if kind == b"IHDR":
        w, h, depth, ctype, _, _, inter = struct.unpack(">IIBBBBB", body)
        assert depth == 8 and ctype in (2, 6) and inter == 0, (depth, ctype, inter)
        bpp = 3 if ctype == 2 else 4
    elif kind == b"IDAT":
        idat += body
    pos += 12 + n
raw, stride, rows, prev = zlib.decompress(idat), w * bpp, [], bytearray(w * bpp)
for y in range(h):
    f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
    for i in range(stride):
        a = line[i - bpp] if i >= bpp else 0
        b, c = prev[i], prev[i - bpp] if i >= bpp else 0
        if f == 1: line[i] = (line[i] + a) & 255
        elif f == 2: line[i] = (line[i] + b) & 255
        elif f == 3: line[i] = (line[i] + (a + b) // 2) & 255
        elif f == 4:
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    rows.append(line)
    prev = line
colored = sum(1 for y in range(120, min(260, h)) for x in range(20, min(500, w))
              if max(rows[y][x * bpp:x * bpp + 3]) - min(rows[y][x * bpp:x * bpp + 3]) > 60)
print("colored pixels in the heat map's area:", colored)
sys.exit(0 if colored > 500 else 1)
PY
expect "the screenshot's heat map is not empty" test $? -eq 0
kill -TERM $pid 2>/dev/null
wait $pid

cli_summary dashboard.sh
