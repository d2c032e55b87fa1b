#!/usr/bin/env python3
"""Writes src/server/server_dashboard.c from src/server/dashboard.html (the page GET / serves).

    python3 tools/gen_dashboard.py      (from the repository root; tests/cli/serve.sh checks that
                                         the served page is the .html's bytes)
"""
import pathlib

root = pathlib.Path(__file__).resolve().parent.parent
html = (root / "src/server/dashboard.html").read_text(encoding="utf-8")
lines = []
for line in html.split("\n"):
    esc = line.replace("\\", "\\\\").replace('"', '\\"')
    lines.append('    "' + esc + '\\n"')
body = "\n".join(lines[:-1] if html.endswith("\n") else lines)
(root / "src/server/server_dashboard.c").write_text(
    "/* server_dashboard.c - the dashboard at GET / (server.h), written by tools/gen_dashboard.py from\n"
    " * src/server/dashboard.html: one page, no external resources. Every 2 s it reads /metrics\n"
    " * (counts, tokens per second over time), /moe-routing (a layers x experts heat map of routing,\n"
    " * each row scaled to its busiest expert), /moe-layer-perf (the hot and cold share per layer\n"
    " * and the lanes' times per call, when the counters are on) and /moe-hot-cache (the cache's\n"
    " * contents). With --api-key, open it as /?key=KEY: its requests carry the key. */\n"
    '#include "server/server_internal.h"\n\n'
    "const char srv_dashboard_html[] =\n" + body + ";\n", encoding="utf-8")
