#!/usr/bin/env python3
"""End-to-end check of the vmar driver in qemu-storage-daemon and qemu-io.

Usage: qsd-smoke.py QEMU_PREFIX [VECTORS_DIR]

Uses the valid vectors that have a "base_dir" in their JSON.  It
 1. starts qemu-storage-daemon with one read-only raw node per base file,
    named <prefix><base64url id>, one vmar node per valid vector sharing
    them through base-node-prefix, and an NBD export per vmar node (named
    after the map's image id plus the vector name), on a unix socket;
 2. adds one more vmar node at run time over QMP, with an explicit
    "targets" list, and exports it with block-export-add;
 3. compares every export with NAME.expected using the system
    /usr/bin/qemu-img compare over nbd+unix (stock QEMU as the client);
 4. checks that a writable vmar node is refused, that base nodes in use
    cannot be deleted, that a vmar node with base-dir opens its files with
    cache.direct=off even under cache.direct=on, and that qemu-io reads and
    write refusal behave;
 5. checks the counters of query-named-block-nodes, quits the daemon
    over QMP and checks the trace event vmar_close of each node.
Prints "N passed, N failed" last; exit status 1 on any failure.
"""

import base64
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid

PREFIX_NODE = "vb"
SYSTEM_QEMU_IMG = "/usr/bin/qemu-img"

passed = 0
failed = 0


def check(ok, what, detail=""):
    global passed, failed
    if ok:
        passed += 1
        print("ok   " + what)
    else:
        failed += 1
        print("FAIL %s %s" % (what, detail))


def b64id(u):
    return base64.urlsafe_b64encode(uuid.UUID(u).bytes).rstrip(b"=").decode()


class QMP:
    def __init__(self, path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.file = self.sock.makefile("rw")
        json.loads(self.file.readline())            # greeting
        self.cmd("qmp_capabilities")

    def cmd(self, command, **args):
        self.file.write(json.dumps({"execute": command, "arguments": args}))
        self.file.write("\n")
        self.file.flush()
        while True:
            msg = json.loads(self.file.readline())
            if "event" not in msg:
                return msg


def wait_for(path, proc, timeout=20):
    end = time.time() + timeout
    while time.time() < end:
        if os.path.exists(path):
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.05)
    return False


def load_vectors(vdir):
    out = []
    for name in sorted(os.listdir(vdir)):
        if not name.endswith(".json"):
            continue
        info = json.load(open(os.path.join(vdir, name)))
        if info.get("valid") and info.get("base_dir"):
            out.append((name[:-5], info))
    return out


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    prefix = sys.argv[1]
    here = os.path.dirname(os.path.abspath(__file__))
    vdir = sys.argv[2] if len(sys.argv) == 3 else os.path.join(
        here, "..", "..", "tests", "vectors")
    vdir = os.path.realpath(vdir)
    qsd = os.path.join(prefix, "bin", "qemu-storage-daemon")
    qemu_io = os.path.join(prefix, "bin", "qemu-io")
    vectors = load_vectors(vdir)
    if not vectors:
        sys.exit("qsd-smoke: no valid vectors with base_dir in " + vdir)
    if not os.path.exists(SYSTEM_QEMU_IMG):
        sys.exit("qsd-smoke: %s missing (apt-get install qemu-utils)"
                 % SYSTEM_QEMU_IMG)

    tmp = tempfile.mkdtemp(prefix="vmar-qsd-")
    sock = os.path.join(tmp, "nbd.sock")
    qmp_sock = os.path.join(tmp, "qmp.sock")
    stats = os.path.join(tmp, "trace.log")
    base_dir = os.path.join(vdir, vectors[0][1]["base_dir"])

    args = [qsd, "--chardev",
            "socket,id=qmp,path=%s,server=on,wait=off" % qmp_sock,
            "--monitor", "chardev=qmp",
            "--nbd-server", "addr.type=unix,addr.path=%s" % sock]
    bases = sorted({t["image_id"] for _, info in vectors
                    for t in info["targets"]})
    for b in bases:
        args += ["--blockdev", json.dumps({
            "driver": "raw", "node-name": PREFIX_NODE + b64id(b),
            "read-only": True,
            "file": {"driver": "file", "cache": {"direct": False},
                     "node-name": "vf" + b64id(b),
                     "filename": os.path.join(base_dir, b)}})]
    exports = {}
    for i, (name, info) in enumerate(vectors):
        node = "vmar%d" % i
        args += ["--blockdev", json.dumps({
            "driver": "vmar", "node-name": node, "read-only": True,
            "cache": {"direct": True},
            "base-node-prefix": PREFIX_NODE,
            "file": {"driver": "file", "read-only": True,
                     "filename": os.path.join(vdir, name + ".vmap")}})]
        export = "%s-%s" % (info["image_id"], name)
        args += ["--export", "type=nbd,id=e%d,node-name=%s,name=%s"
                 % (i, node, export)]
        exports[name] = export

    # the read counters at close are the trace event vmar_close
    args += ["--trace", "enable=vmar_close,file=%s" % stats]
    log = open(os.path.join(tmp, "qsd.log"), "w")
    proc = subprocess.Popen(args, stdout=log, stderr=log)
    try:
        up = wait_for(sock, proc) and wait_for(qmp_sock, proc)
        check(up, "qemu-storage-daemon started with %d vmar nodes sharing "
              "%d base nodes" % (len(vectors), len(bases)),
              open(os.path.join(tmp, "qsd.log")).read())
        if not up:
            return 1
        qmp = QMP(qmp_sock)

        # run-time blockdev-add with an explicit targets list
        name, info = vectors[-1]
        r = qmp.cmd("blockdev-add", **{
            "driver": "vmar", "node-name": "vmar-qmp", "read-only": True,
            "targets": [PREFIX_NODE + b64id(t["image_id"])
                        for t in info["targets"]],
            "file": {"driver": "file",
                     "filename": os.path.join(vdir, name + ".vmap")}})
        check("return" in r, "QMP blockdev-add vmar with targets list", r)
        r = qmp.cmd("block-export-add", type="nbd", id="eqmp",
                    **{"node-name": "vmar-qmp", "name": "qmp-" + name})
        check("return" in r, "QMP block-export-add", r)
        exports_all = dict(exports)
        exports_all["qmp:" + name] = "qmp-" + name

        # compare every export with stock qemu-img over NBD
        for vname, export in sorted(exports_all.items()):
            expected = os.path.join(vdir, vname.split(":")[-1] + ".expected")
            uri = "nbd+unix:///%s?socket=%s" % (export, sock)
            r = subprocess.run([SYSTEM_QEMU_IMG, "compare", "-f", "raw",
                                "-F", "raw", uri, expected],
                               capture_output=True, text=True)
            check(r.returncode == 0, "system qemu-img compare %s" % export,
                  r.stdout + r.stderr)

        # a writable vmar node is refused
        r = qmp.cmd("blockdev-add", **{
            "driver": "vmar", "node-name": "vmar-rw",
            "base-node-prefix": PREFIX_NODE,
            "file": {"driver": "file",
                     "filename": os.path.join(vdir, name + ".vmap")}})
        check("error" in r and "read-only" in r["error"]["desc"],
              "writable vmar node refused", r)

        # a base node in use cannot be deleted
        r = qmp.cmd("blockdev-del",
                    **{"node-name": PREFIX_NODE + b64id(bases[0])})
        check("error" in r, "base node in use not deletable", r)

        # base-dir children are cache.direct=off under a cache.direct=on
        # parent, and on with base-cache-direct=true
        for direct in (False, True):
            node = "vmar-dir-%d" % direct
            r = qmp.cmd("blockdev-add", **{
                "driver": "vmar", "node-name": node, "read-only": True,
                "cache": {"direct": True}, "base-dir": base_dir,
                "base-cache-direct": direct,
                "file": {"driver": "file",
                         "filename": os.path.join(vdir, name + ".vmap")}})
            check("return" in r, "blockdev-add vmar base-dir "
                  "base-cache-direct=%s" % direct, r)
            nodes = qmp.cmd("query-named-block-nodes", flat=True)["return"]
            kids = [n for n in nodes if n["file"].startswith(base_dir + "/")
                    and n["drv"] == "file"
                    and not n["node-name"].startswith(("vb", "vf"))]
            ok = kids and all(n["cache"]["direct"] == direct for n in kids)
            check(ok, "base-dir targets have cache.direct=%s" % direct,
                  [(n["node-name"], n["cache"]) for n in kids])
            r = qmp.cmd("blockdev-del", **{"node-name": node})
            check("return" in r, "blockdev-del %s" % node, r)

        # the counters, lookups included, are the nodes' image information
        nodes = qmp.cmd("query-named-block-nodes", flat=True)["return"]
        info = {n["node-name"]: n["image"]["format-specific"]["data"]
                for n in nodes if n["drv"] == "vmar"}
        check(len(info) == len(vectors) + 1 and
              all(i["lookups"] >= i["requests"] and
                  (i["requests"] > 0 or not i["extents"])
                  for i in info.values()),
              "query-named-block-nodes gives each vmar node's counters",
              info)

        r = qmp.cmd("quit")
        proc.wait(timeout=20)
        check(proc.returncode == 0, "daemon quit cleanly",
              open(os.path.join(tmp, "qsd.log")).read())
        lines = [x for x in open(stats) if "vmar_close " in x] \
            if os.path.exists(stats) else []
        check(len(lines) >= len(vectors) + 1 and
              all(" lookups " in x for x in lines),
              "trace event vmar_close for each vmar node (%d)" % len(lines),
              lines)
        print("trace: " + "".join(lines[:2]))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    # qemu-io: pattern reads and write refusal on the first vector
    name, info = vectors[0]
    spec = "json:" + json.dumps({
        "driver": "vmar", "base-dir": base_dir,
        "file": {"driver": "file",
                 "filename": os.path.join(vdir, name + ".vmap")}})
    expected = open(os.path.join(vdir, name + ".expected"), "rb").read()
    bs = info["block_size"]
    for blk in range(len(expected) // bs):
        chunk = expected[blk * bs:(blk + 1) * bs]
        if chunk.count(chunk[:1]) == len(chunk):
            r = subprocess.run([qemu_io, "-r", "-c", "read -P %d %d %d"
                                % (chunk[0], blk * bs, bs), spec],
                               capture_output=True, text=True)
            check(r.returncode == 0 and "Pattern verification failed"
                  not in r.stdout, "qemu-io read -P %d block %d of %s"
                  % (chunk[0], blk, name), r.stdout + r.stderr)
            break
    r = subprocess.run([qemu_io, "-c", "write 0 4096", spec],
                       capture_output=True, text=True)
    check(r.returncode != 0 or "failed" in r.stdout + r.stderr,
          "qemu-io write refused", r.stdout + r.stderr)

    shutil.rmtree(tmp, ignore_errors=True)
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
