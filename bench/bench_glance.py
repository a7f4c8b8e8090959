#!/usr/bin/env python3
"""Glance integration benchmark, with a same-run baseline.

Time from "upload finished" (the PUT of a 1 GiB Debian library image, what
``openstack image create --file`` does, answered: the image is active) to
"map available" (its map version fetchable from Glance by a compute host's
map source), as a ratio to the bare ingest (``Library.add`` into an empty
SQLite library, no Glance) of the same image in the same run. Goal <= 1.3.

Everything is real: RabbitMQ, glance-api (uWSGI, file store, MariaDB, no
Keystone), ``vmar-agent``. Each round uses a fresh library (database and
state) for both paths, so both ingest into an empty library; the agent first
handles a small untimed image, as a running agent has.

Two agent set-ups: the image downloaded from Glance (python-glanceclient),
and read in place from the Glance file store on the same host
(``[vmar_agent] local_store_dir``).

"Map available" is detected without loading the machine: the bench listens
(its own pool) for Glance's ``image.activate`` of the map image, then asks
the host's map source, timed too, until it sees it (Glance notifies just
before it commits). Polling Glance every 10 ms, as an earlier version did,
kept glance-api busy on one of the two cores while the agent was hashing,
and slowed the very thing it measured.

Usage: bench_glance.py [--image PATH] [--rounds 3] [--json OUT]
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))

from oslo_config import cfg  # noqa: E402
import oslo_messaging  # noqa: E402

from tools.vmarenv import glance_env  # noqa: E402
from tools.vmarenv import rabbitmq_env  # noqa: E402
from tools.vmarenv import services  # noqa: E402
from vmar_openstack import conf as vmar_conf  # noqa: E402
from vmar_openstack.db import migration  # noqa: E402
from vmar_openstack.db import session as db_session  # noqa: E402
from vmar_openstack.exception import SourceError  # noqa: E402
from vmar_openstack import ingest  # noqa: E402
from vmar_openstack.mapsource import glance as gsource  # noqa: E402
from vmar_openstack import names  # noqa: E402


def library_conf(state, sections=None):
    conf = cfg.ConfigOpts()
    vmar_conf.register_opts(conf)
    path = os.path.join(state, 'vmar.conf')
    glance_env.write_conf(path, dict({
        'vmar': {'state_dir': state},
        'vmar_database': {'connection': 'sqlite:///%s/vmar.sqlite'
                          % state}}, **(sections or {})))
    conf(['--config-file', path], project='vmar')
    migration.upgrade('head', conf=conf)
    return conf, path


def bare_ingest(work, image):
    """Seconds of a Library.add into an empty library, with checkpoint."""
    state = tempfile.mkdtemp(dir=work)
    conf, _ = library_conf(state)
    t0 = time.monotonic()
    ingest.Library(conf).add(str(uuid.uuid4()), image, keep_base=False)
    # The library's SQLite checkpoint runs in a thread after the commit;
    # it is part of the ingest's work (it ran inside the commit until the
    # fourth session), and in the agent it runs while the map is published.
    db_session.wait_for_checkpoints()
    dt = time.monotonic() - t0
    shutil.rmtree(state)
    return dt


class ActivateWatcher:
    """Glance ``image.activate`` notifications, as they arrive."""

    def __init__(self, transport_url):
        conf = cfg.ConfigOpts()
        conf([], project='vmar-bench', default_config_files=[])
        self.transport = oslo_messaging.get_notification_transport(
            conf, url=transport_url)
        self.seen = {}
        self.cond = threading.Condition()
        self.listener = oslo_messaging.get_notification_listener(
            self.transport,
            [oslo_messaging.Target(topic='notifications',
                                   exchange='glance')],
            [self], executor='threading', pool='vmar-bench')

    def info(self, ctxt, publisher_id, event_type, payload, metadata):
        if event_type == 'image.activate' and isinstance(payload, dict):
            with self.cond:
                self.seen[payload.get('id')] = time.monotonic()
                self.cond.notify_all()

    def wait(self, image_id, timeout):
        with self.cond:
            if not self.cond.wait_for(lambda: image_id in self.seen,
                                      timeout):
                raise TimeoutError('no image.activate for %s' % image_id)
            return self.seen[image_id]

    def start(self):
        self.listener.start()

    def stop(self):
        self.listener.stop()
        self.listener.wait()
        self.transport.cleanup()


def upload(client, path):
    image_id = client.images.create(
        name='bench-%s' % uuid.uuid4().hex[:6], disk_format='raw',
        container_format='bare')['id']
    with open(path, 'rb') as f:
        client.images.upload(image_id, f, image_size=os.path.getsize(path))
    return image_id


def glance_round(work, glance, rabbit, watcher, image, local):
    state = tempfile.mkdtemp(dir=work)
    conf, path = library_conf(state, {
        'vmar_agent': {'local_store_dir': glance.store_dir if local
                       else ''},
        'DEFAULT': {'transport_url': rabbit.transport_url,
                    'debug': str(bool(os.environ.get('VMAR_BENCH_DEBUG')))},
        'vmar_glance': {'auth_type': 'none', 'endpoint': glance.endpoint,
                        'endpoint_override': glance.endpoint}})
    log = open(os.path.join(state, 'agent.log'), 'ab')
    agent = subprocess.Popen(
        [os.path.join(os.path.dirname(sys.executable), 'vmar-agent'),
         '--config-file', path], stdout=log, stderr=log)
    try:
        time.sleep(2)       # listening
        client = glance.glanceclient()
        # A running agent has handled images before: warm this one up with
        # a small image (imports, SQLAlchemy's statement cache, the first
        # connection), untimed, so that the round measures the steady state
        warm = os.path.join(state, 'warm.raw')
        with open(warm, 'wb') as f:
            f.write(os.urandom(4 << 20))
        warm_id = upload(client, warm)
        watcher.wait(names.map_image_id(warm_id, 1), 120)
        client.images.delete(warm_id)
        # the PUT upload of "openstack image create --file", in process so
        # that its end is timed exactly: Glance activates the image
        # before it answers
        image_id = upload(client, image)
        t_uploaded = time.monotonic()
        if os.environ.get('VMAR_BENCH_DEBUG'):
            print('uploaded at %s' % time.strftime('%H:%M:%S'),
                  time.time() % 1)
        assert client.images.get(image_id)['status'] == 'active'

        source = gsource.GlanceSource(conf)
        watcher.wait(names.map_image_id(image_id, 1), 600)
        # Glance notifies just before it commits the activation: ask the
        # host's map source as a compute host would, until it sees it
        deadline = time.monotonic() + 30
        while True:
            try:
                source.current_version(image_id)
                break
            except SourceError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.005)
        dt = time.monotonic() - t_uploaded
        stored = os.path.join(glance.store_dir, image_id)
        bare_stored = bare_ingest(work, stored)
        client.images.delete(image_id)
        return dt, bare_stored
    finally:
        agent.terminate()
        agent.wait()
        log.close()
        if os.environ.get('VMAR_BENCH_DEBUG'):
            with open(os.path.join(state, 'agent.log')) as f:
                print(''.join(x[11:140] + '\n' for x in f
                              if 'vmar_openstack' in x))
        shutil.rmtree(state, ignore_errors=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument('--image', default='/var/cache/vmar-openstack/images/'
                   'python3.raw')
    p.add_argument('--rounds', type=int, default=3)
    p.add_argument('--json')
    args = p.parse_args()
    work = tempfile.mkdtemp(prefix='vmar-bench-glance-')
    rabbit = rabbitmq_env.RabbitMQ(os.path.join(work, 'rabbit'))
    glance = watcher = None
    try:
        rabbit.start()
        # Glance on MariaDB, as deployed (and as the functional tests run
        # it): on SQLite, the bench's own calls and the agent's map
        # uploads at once sometimes got HTTP 500 "database is locked"
        glance = glance_env.GlanceAPI(
            os.path.join(work, 'glance'), rabbit.transport_url,
            extra_config={'database': {
                'connection': services.mariadb_database('bench_glance')}})
        glance.start()
        watcher = ActivateWatcher(rabbit.transport_url)
        watcher.start()
        bare, stored, via, local = [], [], [], []
        for r in range(args.rounds):
            bare.append(bare_ingest(work, args.image))
            via.append(glance_round(work, glance, rabbit, watcher,
                                    args.image, False)[0])
            dt, bare_stored = glance_round(work, glance, rabbit, watcher,
                                           args.image, True)
            local.append(dt)
            stored.append(bare_stored)
            print('round %d: bare ingest %.2fs (sparse original), %.2fs '
                  '(Glance\'s stored copy); upload->map %.2fs (download), '
                  '%.2fs (local store)' % (r + 1, bare[-1], stored[-1],
                                           via[-1], local[-1]), flush=True)
        med = statistics.median
        res = {'image': args.image,
               'size': os.path.getsize(args.image),
               'bare_ingest_s': bare, 'bare_ingest_stored_s': stored,
               'upload_to_map_download_s': via,
               'upload_to_map_local_store_s': local,
               'ratio_download': med(via) / med(bare),
               'ratio_local_store': med(local) / med(bare),
               'ratio_download_vs_stored': med(via) / med(stored),
               'ratio_local_store_vs_stored': med(local) / med(stored)}
        print('upload finished -> map available, over the bare ingest of '
              'the original (sparse) file: %.2f with a download, %.2f from '
              'a local file store; over the bare ingest of Glance\'s stored '
              '(dense) copy: %.2f, %.2f (goal <= 1.3)'
              % (res['ratio_download'], res['ratio_local_store'],
                 res['ratio_download_vs_stored'],
                 res['ratio_local_store_vs_stored']))
        if args.json:
            with open(args.json, 'w') as f:
                json.dump(res, f, indent=1)
    finally:
        if watcher:
            watcher.stop()
        if glance:
            glance.stop()
        rabbit.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == '__main__':
    main()
