#!/usr/bin/python3
"""The folders of src/ are layers (../shared/ARCHITECTURE.md): an include may run to the same
folder or down to one that the table below lets it use, never up. An upward include is allowed
only with a comment on its own line that says why and contains the word "upward", e.g.
    #include "route/route.h" /* upward: ... */
Prints every include that breaks the rule and exits 1; make test runs it before the unit tests.

    check-layers.py [SRC_DIR]     (default: src beside this script's folder)
"""
import os
import re
import sys

# What each folder may include beside itself. The order is the map's, bottom first.
USES = {
    "core": set(),                        # base, buf, err, log, metrics, cpu, notify, cidr, conf
    "index": {"core"},                    # positional index, chain hash
    "events": {"core", "index"},          # zsub, queue, decode, stream, ingest, assume
    "text": {"core"},                     # tokenizers, chat templates
    "load": {"core"},                     # the engines' own load (/metrics scraper)
    "route": {"core", "index", "load"},   # score, route
    "state": {"core", "index", "events"}, # snapshots
    "http": {"core", "index", "events", "text", "load", "route", "state"},
    "daemon": {"core", "index", "events", "text", "load", "route", "state", "http"},
}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"(.*)$')


def check(src):
    bad = []
    folders = sorted(d for d in os.listdir(src) if os.path.isdir(os.path.join(src, d)))
    for d in folders:
        if d not in USES:
            bad.append(f"{src}/{d}: a folder the layer table does not know (add it to {__file__})")
            continue
        for name in sorted(os.listdir(os.path.join(src, d))):
            if not name.endswith((".c", ".h")):
                continue
            path = os.path.join(src, d, name)
            with open(path, encoding="utf-8") as f:
                for lineno, line in enumerate(f, 1):
                    m = INCLUDE.match(line)
                    if not m:
                        continue
                    target, rest = m.group(1), m.group(2)
                    if "/" not in target:
                        bad.append(f"{path}:{lineno}: \"{target}\": project headers are included as \"<folder>/<header>\"")
                        continue
                    to = target.split("/", 1)[0]
                    if to == d or to in USES[d]:
                        continue
                    if "upward" in rest:
                        continue
                    bad.append(f"{path}:{lineno}: {d} -> {to} (\"{target}\") runs against the layer map")
    stray = sorted(f for f in os.listdir(src) if os.path.isfile(os.path.join(src, f)))
    for f in stray:
        bad.append(f"{src}/{f}: a file outside the subsystem folders")
    return bad


def main():
    src = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
    src = os.path.normpath(src)
    bad = check(src)
    for b in bad:
        print(b)
    if bad:
        print(f"check-layers: {len(bad)} problem(s)")
        return 1
    print(f"check-layers: {src}: every include runs within its folder or downward")
    return 0


if __name__ == "__main__":
    sys.exit(main())
