#!/usr/bin/env python3
"""Store bytes when a lazy host reads from a peer first (issue 34).

One library image is uploaded to a real glance-api (file store; uwsgi's
request log counts the bytes its ``/file`` range requests send). Host A
holds it and runs the peer server (nbdkit, TLS with the run's host CA).
Host B reads every data run of the image in 1 MiB pieces, as its mirror
fills it, through what its mirror's fetch quorum reads (QEMU's quorum,
``read-pattern=fifo``): the real peer fetcher (nbdkit with
``nbdkit_peers.py``) first, then the real range server (nbdkit with
``nbdkit_glance.py``), in three configurations measured in the same run:

* ``store``: no peers: everything from Glance (the baseline);
* ``peer-whole``: A holds the whole base: Glance should send nothing;
* ``peer-half``: A holds a mirror with every other MiB of the image's
  data: Glance sends what A lacks.

Figures: Glance's bytes against the baseline's, the peer's share, and the
wall time of each read-through (context, not a goal: one machine, no
network between the hosts).

Usage: bench_peers.py --qemu-prefix DIR [--image minbase] [--json OUT]
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                '..'))

from oslo_config import cfg  # noqa: E402

from tools.vmarenv import glance_env  # noqa: E402
from tools.vmarenv import pki  # noqa: E402
from tools.vmarenv import process  # noqa: E402
from tools.vmarenv import qemu_env  # noqa: E402
from tools.vmarenv import range_env  # noqa: E402
from vmar_openstack import conf as vmar_conf  # noqa: E402
from vmar_openstack import fingerprint  # noqa: E402
from vmar_openstack.host.exports import hostdir  # noqa: E402
from vmar_openstack.host.peers import server as peers  # noqa: E402
from vmar_openstack.mapformat import mirror as mirror_format  # noqa: E402
from vmar_openstack import names  # noqa: E402

MIB = 1 << 20
SERVED = re.compile(r'GET /v2/images/[0-9a-f-]+/file => generated (\d+) '
                    r'bytes')


def glance_bytes(glance):
    with open(glance.uwsgi_log, errors='replace') as f:
        return sum(int(m) for m in SERVED.findall(f.read()))


def data_runs(path):
    """The image's data extents, as (offset, length) pieces of <= 1 MiB."""
    out = subprocess.run(['qemu-img', 'map', '--output=json', '-f', 'raw',
                          path], capture_output=True, text=True, check=True)
    runs = []
    for e in json.loads(out.stdout):
        if not e['data']:
            continue
        off, end = e['start'], e['start'] + e['length']
        while off < end:
            n = min(MIB - off % MIB, end - off)
            runs.append((off, n))
            off += n
    return runs


def read_through(sock, peer_sock, image_id, size, runs):
    """Read ``runs`` as a mirror's fetch quorum would: peers, then store."""
    children = []
    if peer_sock:
        children.append((peer_sock, names.peer_fetch_export(image_id,
                                                            size)))
    children.append((sock, names.glance_fetch_export(image_id, size)))
    spec = ','.join(
        ['driver=quorum,read-pattern=fifo,vote-threshold=1']
        + ['children.%d.driver=nbd,children.%d.server.type=unix,'
           'children.%d.server.path=%s,children.%d.export=%s'
           % (i, i, i, path, i, export)
           for i, (path, export) in enumerate(children)])
    cmds = []
    for off, n in runs:
        cmds += ['-c', 'read %d %d' % (off, n)]
    t = time.monotonic()
    r = subprocess.run([qemu_env.qemu_bin('qemu-io'), '-r', '--image-opts',
                        spec] + cmds, capture_output=True, text=True)
    if r.returncode or 'error' in r.stdout + r.stderr:
        raise RuntimeError('read-through failed: %s'
                           % (r.stdout[-500:] + r.stderr))
    return time.monotonic() - t


def host_a(work, image_path, image_id, runs, half, tls):
    """Host A's peer server, holding the whole base or half its data."""
    d = os.path.join(work, 'host-a-%s' % ('half' if half else 'whole'))
    kind = 'mirrors' if half else 'bases'
    os.makedirs(os.path.join(d, kind))
    dest = os.path.join(d, kind, image_id)
    size = os.path.getsize(image_path)
    with open(image_path, 'rb') as src, open(dest, 'wb') as out:
        out.truncate(size)
        for off, n in runs:
            if half and (off // MIB) % 2:
                continue
            src.seek(off)
            out.seek(off)
            out.write(src.read(n))
    conf = cfg.ConfigOpts()
    vmar_conf.register_opts(conf)
    conf([], project='vmar', default_config_files=[])
    conf.set_override('host_dir', d, group='vmar_host')
    port = process.free_port()
    for k, v in (('listen_address', '127.0.0.1'), ('listen_port', port),
                 ('tls_dir', tls), ('rate_mib', 0)):
        conf.set_override(k, v, group='vmar_peers')
    return peers.start(conf), port


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--qemu-prefix', required=True)
    p.add_argument('--image', default='minbase')
    p.add_argument('--json')
    args = p.parse_args()
    os.environ['VMAR_QEMU_PREFIX'] = args.qemu_prefix
    image_path = qemu_env.image_library()[args.image]
    work = tempfile.mkdtemp(prefix='vmar-bench-peers-')
    procs = []
    # no notifications: nothing here listens (the noop driver never
    # connects to the transport)
    glance = glance_env.GlanceAPI(
        os.path.join(work, 'glance'), 'rabbit://unused@127.0.0.1:1/',
        extra_config={'oslo_messaging_notifications': {'driver': 'noop'}})
    try:
        ca = os.path.join(work, 'ca')
        pki.make_ca(ca, 'bench host CA')
        server_tls, client_tls = (os.path.join(work, n)
                                  for n in ('server', 'client'))
        pki.make_cert(ca, server_tls, 'server', '127.0.0.1', 'IP:127.0.0.1')
        pki.make_cert(ca, client_tls, 'client', 'host-b')
        glance.start()
        out = glance.openstack(
            'image', 'create', '--file', image_path, '--disk-format', 'raw',
            '--container-format', 'bare', '-f', 'value', '-c', 'id',
            'bench-peers')
        image_id = out.stdout.strip().splitlines()[-1]
        uuid.UUID(image_id)
        size = os.path.getsize(image_path)
        runs = data_runs(image_path)
        data = sum(n for _o, n in runs)

        # host B: the digest list its mirror would have
        b_dir = os.path.join(work, 'host-b')
        digests = hostdir.Layout(b_dir).mirror(image_id).digests
        os.makedirs(os.path.dirname(digests))
        fps = fingerprint.hash_file(image_path, size)
        with open(digests, 'wb') as f:
            f.write(mirror_format.digests_bytes(image_id, fps))

        results = {'image': args.image, 'data_bytes': data}
        for name in ('store', 'peer-whole', 'peer-half'):
            peer_line = ''
            if name != 'store':
                proc, port = host_a(work, image_path, image_id, runs,
                                    name == 'peer-half', server_tls)
                procs.append(proc)
                peer_line = ('[vmar_peers]\npeers = 127.0.0.1:%d\n'
                             'tls_dir = %s\n' % (port, client_tls))
            conf_file = os.path.join(work, 'b-%s.conf' % name)
            with open(conf_file, 'w') as f:
                f.write('[vmar_host]\nhost_dir = %s\nbase_fetch = lazy\n'
                        '[vmar_glance]\nauth_type = none\nendpoint = %s\n'
                        'endpoint_override = %s\n%s'
                        % (b_dir, glance.endpoint, glance.endpoint,
                           peer_line))
            rs, sock = range_env.start(conf_file, os.path.join(
                work, 'fetch-%s.log' % name))
            pf = peer_sock = None
            try:
                if peer_line:
                    pf, peer_sock = range_env.start_peer_fetcher(
                        conf_file, os.path.join(work, 'peer-fetch-%s.log'
                                                % name))
                before = glance_bytes(glance)
                secs = read_through(sock, peer_sock, image_id, size, runs)
                sent = glance_bytes(glance) - before
            finally:
                for p in (rs, pf):
                    if p:
                        range_env.stop(p)
            results[name] = {'glance_bytes': sent, 'seconds': secs}
            print('%-10s Glance sent %7.1f MiB (%.3f of the data), '
                  'read-through %.1f s' % (name, sent / MIB, sent / data,
                                           secs), flush=True)
        base = results['store']['glance_bytes']
        for name in ('peer-whole', 'peer-half'):
            r = results[name]
            r['ratio_to_store'] = r['glance_bytes'] / base if base else None
            print('%-10s Glance bytes against store only: %.3f'
                  % (name, r['ratio_to_store']))
        if args.json:
            with open(args.json, 'w') as f:
                json.dump(results, f, indent=1)
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait()
        glance.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == '__main__':
    main()
