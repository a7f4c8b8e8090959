#!/usr/bin/env python3
"""Independent minimal VMAR map writer, for the C side's own tests.

Writes maps per doc/source/map-format.rst (it is deliberately not the
project's Python writer, so the two cross-check each other), random target
images and the expected content, in the same layout as tests/vectors/:

    NAME.vmap  NAME.json  <uuid>.img  NAME.expected

Usage:
    mkmaps.py vectors OUTDIR     generate a set of valid and invalid vectors
    mkmaps.py seeds OUTDIR       generate fuzzer seed maps only
"""

import json
import os
import random
import sys
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "iotests"))
import vmar_map  # noqa: E402

build_map = vmar_map.build_map
ceil_div = vmar_map.ceil_div


def new_id(rng):
    return uuid.UUID(int=rng.getrandbits(128), version=4).bytes


def random_case(rng, name, n_targets=None, self_target=None):
    bs = rng.choice([4096, 8192, 65536])
    n_blocks = rng.randint(1, 300)
    tail = rng.choice([0, 0, rng.randint(1, bs - 1)])
    vsize = n_blocks * bs if tail == 0 else (n_blocks - 1) * bs + tail
    image_id = new_id(rng)
    if n_targets is None:
        n_targets = rng.randint(1, 4)
    if self_target is None:
        self_target = rng.random() < 0.3
    targets = []
    for i in range(n_targets):
        if self_target and i == 0:
            targets.append((image_id, vsize, 1))
            continue
        tblocks = rng.randint(1, 400)
        ttail = rng.choice([0, 0, rng.randint(1, bs - 1)])
        tsize = tblocks * bs if ttail == 0 else (tblocks - 1) * bs + ttail
        tid = new_id(rng)
        targets.append((tid, tsize, 0))
    rng.shuffle(targets)
    extents = []
    b = 0
    while b < n_blocks:
        b += rng.choice([0, 0, rng.randint(1, 20)])
        if b >= n_blocks:
            break
        length = rng.randint(1, min(40, n_blocks - b))
        t = rng.randrange(n_targets)
        tid, tsize, _ = targets[t]
        tblocks = ceil_div(tsize, bs)
        ttail = tsize % bs
        # keep clear of the target's partial last block unless aligned
        usable = tblocks - (1 if ttail else 0)
        if length > usable:
            length = usable
        if length <= 0:
            b += 1
            continue
        tb = rng.randint(0, usable - length)
        extents.append((b, length, tb, t))
        b += length
    # sometimes map the partial last block onto a matching target tail
    for t, (tid, tsize, _) in enumerate(targets):
        if (tail and tsize % bs == tail and
                (not extents or extents[-1][0] + extents[-1][1] < n_blocks)):
            tblocks = ceil_div(tsize, bs)
            length = 1
            extents.append((n_blocks - 1, length, tblocks - 1, t))
            break
    return dict(name=name, bs=bs, vsize=vsize, image_id=image_id,
                targets=targets, extents=extents)


def write_vector(outdir, case, tweak=None, reason=None, rng=None):
    data = build_map(case["bs"], case["vsize"], case["image_id"],
                     case["targets"], case["extents"], tweak=tweak)
    name = case["name"]
    with open(os.path.join(outdir, name + ".vmap"), "wb") as f:
        f.write(data)
    info = {"valid": reason is None}
    if reason:
        info["reason"] = reason
    else:
        bs = case["bs"]
        contents = {}
        for tid, tsize, _ in case["targets"]:
            u = str(uuid.UUID(bytes=tid))
            path = os.path.join(outdir, u + ".img")
            if os.path.exists(path):
                content = open(path, "rb").read()
            else:
                content = rng.randbytes(tsize)
            assert len(content) == tsize
            contents[tid] = content
            with open(path, "wb") as f:
                f.write(content)
        out = bytearray(case["vsize"] + bs)
        for src, length, tb, t in case["extents"]:
            content = contents[case["targets"][t][0]]
            chunk = content[tb * bs:(tb + length) * bs]
            out[src * bs:src * bs + len(chunk)] = chunk
        with open(os.path.join(outdir, name + ".expected"), "wb") as f:
            f.write(out[:case["vsize"]])
        info["targets"] = [{"image_id": str(uuid.UUID(bytes=t[0])),
                            "size": t[1], "flags": t[2]}
                           for t in case["targets"]]
        info["extents"] = [list(e) for e in case["extents"]]
    with open(os.path.join(outdir, name + ".json"), "w") as f:
        json.dump(info, f)


def set_field(key, value):
    def tweak(f, body):
        if body is None:
            f[key] = value
    return tweak


def body_tweak(fn):
    def tweak(f, body):
        if body is not None:
            fn(f, body)
    return tweak


def vectors(outdir, seeds_only=False):
    os.makedirs(outdir, exist_ok=True)
    rng = random.Random(1234)
    valid = []
    for i in range(40):
        case = random_case(rng, "c-valid-%02d" % i)
        write_vector(outdir, case, rng=rng)
        valid.append(case)
    # all-zero disk, one target, no extents
    case = random_case(rng, "c-valid-empty")
    case["extents"] = []
    write_vector(outdir, case, rng=rng)
    # big sparse disk: one extent far out
    case = random_case(rng, "c-valid-sparse", n_targets=1, self_target=False)
    case.update(bs=4096, vsize=(256 << 20) + 1234,
                targets=[(uuid.UUID(int=rng.getrandbits(128),
                                    version=4).bytes, 5 * 4096, 0)],
                extents=[(60000, 3, 1, 0)])
    write_vector(outdir, case, rng=rng)

    base = valid[0]
    invalid = {
        "version": set_field("version", 2),
        "header-size": set_field("header_size", 256),
        "block-size": set_field("block_size", 3000),
        "flags": set_field("flags", 1),
        "header-crc": set_field("header_crc", 1),
        "body-crc": set_field("body_crc", 1),
        "file-size": set_field("file_size", 8),
        "n-sections": set_field("n_sections", 0),
        "filter-bytes": set_field("filter_bytes", 1000),
        "section-shift": set_field("section_shift", 40),
        "virtual-size": set_field("virtual_size", 0),
        "map-version": set_field("map_version", 0),
        "n-targets": set_field("n_targets", 0),
    }
    for reason, tweak in invalid.items():
        case = dict(base, name="c-invalid-" + reason)
        write_vector(outdir, case, tweak=tweak, reason=reason)

    def ext_case(reason, extents, targets=None, vsize=None):
        case = dict(base, name="c-invalid-" + reason, extents=extents)
        if targets is not None:
            case["targets"] = targets
        if vsize is not None:
            case["vsize"] = vsize
        write_vector(outdir, case, reason=reason)

    e = base["extents"]
    n_blocks = ceil_div(base["vsize"], base["bs"])
    if len(e) >= 2:
        ext_case("extent-order", [e[1], e[0]] + e[2:])
        ext_case("extent-overlap",
                 [(e[0][0], e[1][0] - e[0][0] + 1, e[0][2], e[0][3])] + e[1:])
    ext_case("extent-zero-length", [(0, 0, 0, 0)])
    ext_case("extent-past-end", [(n_blocks - 1, 2, 0, 0)])
    ext_case("extent-target-index", [(0, 1, 0, len(base["targets"]))])
    tblocks = ceil_div(base["targets"][0][1], base["bs"])
    ext_case("extent-target-range", [(0, 1, tblocks, 0)])
    tid = base["targets"][0][0]
    ext_case("target-duplicate", e, targets=base["targets"] + [
        (tid, base["targets"][0][1], 0)])
    ext_case("target-size-zero", e, targets=base["targets"] + [
        (new_id(rng), 0, 0)])
    ext_case("target-flags", e, targets=base["targets"] + [
        (new_id(rng), 4096, 2)])
    ext_case("target-self-mismatch", e, targets=base["targets"] + [
        (new_id(rng), 4096, 1)])
    # partial last block of the target mapped to a full source block
    bs = base["bs"]
    case = dict(base, name="c-invalid-partial-last", vsize=10 * bs,
                targets=[(new_id(rng), 3 * bs + 100, 0)],
                extents=[(0, 4, 0, 0)])
    write_vector(outdir, case, reason="partial-last")

    def index_tweak(f, body):
        off = 32 * f["n_targets"] + 16 * f["n_extents"]
        body[off + 4] ^= 1
    case = dict(base, name="c-invalid-section-index")
    write_vector(outdir, case, tweak=body_tweak(index_tweak),
                 reason="section-index")

    def filter_tweak(f, body):
        off = 32 * f["n_targets"] + 16 * f["n_extents"] + 8 * f["n_sections"]
        body[off] ^= 0x80
    case = dict(base, name="c-invalid-filter")
    write_vector(outdir, case, tweak=body_tweak(filter_tweak),
                 reason="filter")
    with open(os.path.join(outdir, "c-invalid-truncated.vmap"), "wb") as f:
        valid00 = os.path.join(outdir, "c-valid-00.vmap")
        f.write(open(valid00, "rb").read()[:200])
    with open(os.path.join(outdir, "c-invalid-truncated.json"), "w") as f:
        json.dump({"valid": False, "reason": "truncated"}, f)
    with open(os.path.join(outdir, "c-invalid-magic.vmap"), "wb") as f:
        f.write(b"X" + open(os.path.join(outdir, "c-valid-00.vmap"),
                            "rb").read()[1:])
    with open(os.path.join(outdir, "c-invalid-magic.json"), "w") as f:
        json.dump({"valid": False, "reason": "magic"}, f)


def seeds(outdir):
    tmp = outdir + ".tmp"
    vectors(tmp)
    os.makedirs(outdir, exist_ok=True)
    for name in sorted(os.listdir(tmp)):
        path = os.path.join(tmp, name)
        if name.endswith(".vmap"):
            os.replace(path, os.path.join(outdir, name))
        else:
            os.unlink(path)
    os.rmdir(tmp)


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("vectors", "seeds"):
        sys.exit(__doc__)
    if sys.argv[1] == "vectors":
        vectors(sys.argv[2])
    else:
        seeds(sys.argv[2])


if __name__ == "__main__":
    main()
