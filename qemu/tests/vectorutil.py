#!/usr/bin/env python3
"""Helpers for check-vectors.sh.

    vectorutil.py valid JSON                  print true or false
    vectorutil.py base-dir JSON VECDIR DFLT   print the targets directory
    vectorutil.py matches-dump JSON < DUMP    compare vmar-check --dump output
    vectorutil.py vmar-json MAP BASE_DIR      print a json: filename for QEMU
    vectorutil.py same-image GOT WANT         exit 0 if the images match
"""

import json
import os
import sys


def valid(path):
    print("true" if json.load(open(path))["valid"] is True else "false")


def base_dir(path, vectors, default):
    """The JSON's base_dir (relative to the vectors dir), else default."""
    d = json.load(open(path)).get("base_dir")
    print(os.path.join(vectors, d) if d else default)


def matches_dump(path):
    """Compare the parser's view (stdin) with what the JSON lists."""
    want = json.load(open(path))
    got = json.load(sys.stdin)
    errors = []
    if "extents" in want and want["extents"] != got["extents"]:
        errors.append("extents differ")
    if "targets" in want:
        w = [(t["image_id"], t["size"],
              bool(t.get("self", t.get("flags", 0) & 1)))
             for t in want["targets"]]
        g = [(t["image_id"], t["size"], bool(t["flags"] & 1))
             for t in got["targets"]]
        if w != g:
            errors.append("targets differ")
    for key in ("image_id", "block_size", "virtual_size", "map_version"):
        if key in want and want[key] != got[key]:
            errors.append(key + " differs")
    print(", ".join(errors))
    return 1 if errors else 0


def vmar_json(map_path, base):
    opts = {"driver": "vmar", "base-dir": base,
            "file": {"driver": "file", "filename": map_path}}
    print("json:" + json.dumps(opts))


def same_image(got_path, want_path):
    """QEMU rounds sizes up to 512 bytes; the extra tail must be zeros."""
    got = open(got_path, "rb").read()
    want = open(want_path, "rb").read()
    ok = (got[:len(want)] == want and len(got) - len(want) < 512 and
          not any(got[len(want):]))
    return 0 if ok else 1


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "valid":
        valid(*args)
    elif cmd == "base-dir":
        base_dir(*args)
    elif cmd == "matches-dump":
        return matches_dump(*args)
    elif cmd == "vmar-json":
        vmar_json(*args)
    elif cmd == "same-image":
        return same_image(*args)
    else:
        sys.exit(__doc__)
    return 0


if __name__ == "__main__":
    sys.exit(main())
