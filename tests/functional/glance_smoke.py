#!/usr/bin/env python3
"""Smoke test of the glance_env harness against a real Glance and RabbitMQ.

    python tests/functional/glance_smoke.py [--keep]

Part 1, no import plugins: upload, glance-direct import and web-download
import through the real ``openstack`` CLI, watch the notifications Glance
sends, download with python-glanceclient, delete.

Part 2, a throwaway import plugin generated in a temp dir (module plus a
dist-info holding its entry point, put on glance-api's PYTHONPATH): proves
``image_import_plugins`` loading and records what Glance hands a plugin.

Exits 0 only if every check passed. --keep keeps the work dir (it is always
kept when a check fails).
"""

import argparse
import functools
import hashlib
import http.server
import json
import os
import shutil
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))

from tools.vmarenv import glance_env  # noqa: E402

POOL = 'vmar-glance-smoke'
PLUGIN = 'vmar_smoke_probe'

PLUGIN_SOURCE = '''\
"""Throwaway Glance import plugin written by glance_smoke.py."""
import hashlib
import inspect
import json
import os
import threading

from oslo_config import cfg
from taskflow.patterns import linear_flow as lf
from taskflow import task

CONF = cfg.CONF
CONF.register_opts([cfg.StrOpt('record_file')], group='vmar_smoke_probe')


def _record(entry):
    with open(CONF.vmar_smoke_probe.record_file, 'a') as f:
        f.write(json.dumps(entry, default=repr) + '\\n')


def _describe(value):
    if isinstance(value, (str, int, float, bool, type(None), dict, list)):
        return value
    return '<%s.%s>' % (type(value).__module__, type(value).__name__)


class _Probe(task.Task):

    def __init__(self, task_id, task_type, context, action_wrapper):
        self.task_id = task_id
        self.context = context
        self.action_wrapper = action_wrapper
        super(_Probe, self).__init__(
            name='%s-VmarSmokeProbe-%s' % (task_type, task_id))

    def execute(self, file_path):
        path = file_path[len('file://'):] if file_path.startswith(
            'file://') else file_path
        entry = {'where': 'execute', 'pid': os.getpid(),
                 'thread': threading.current_thread().name,
                 'execute_signature': str(inspect.signature(self.execute)),
                 'requires': sorted(self.requires),
                 'file_path': file_path, 'exists': os.path.exists(path)}
        if entry['exists']:
            with open(path, 'rb') as f:
                data = f.read()
            entry['size'] = len(data)
            entry['sha256'] = hashlib.sha256(data).hexdigest()
        ctx = self.context
        entry['context'] = {
            'class': _describe(ctx), 'project_id': ctx.project_id,
            'user_id': ctx.user_id, 'roles': ctx.roles,
            'is_admin': ctx.is_admin, 'request_id': ctx.request_id}
        with self.action_wrapper as action:
            entry['action_class'] = _describe(action)
            entry['image_id'] = action.image_id
            entry['image_status'] = action.image_status
            entry['image_size'] = action.image_size
            entry['image_disk_format'] = action.image_disk_format
            entry['image_extra_properties'] = dict(
                action.image_extra_properties)
            action.set_image_extra_properties({
                'vmar_probe': 'ran',
                'vmar_probe_sha256': entry.get('sha256', ''),
                'os_glance_vmar_probe': 'reserved-namespace-is-dropped'})
        _record(entry)


def get_flow(**kwargs):
    _record({'where': 'get_flow', 'pid': os.getpid(),
             'kwargs': {k: _describe(v) for k, v in sorted(kwargs.items())}})
    return lf.Flow(kwargs['task_type']).add(
        _Probe(kwargs['task_id'], kwargs['task_type'], kwargs['context'],
               kwargs['action_wrapper']))
'''


def write_plugin(root, record_file):
    """A module plus a dist-info whose entry point stevedore will find."""
    with open(os.path.join(root, PLUGIN + '.py'), 'w') as f:
        f.write(PLUGIN_SOURCE)
    info = os.path.join(root, PLUGIN + '-0.0.1.dist-info')
    os.makedirs(info)
    with open(os.path.join(info, 'METADATA'), 'w') as f:
        f.write('Metadata-Version: 2.1\nName: %s\nVersion: 0.0.1\n' % PLUGIN)
    with open(os.path.join(info, 'entry_points.txt'), 'w') as f:
        f.write('[glance.image_import.plugins]\n%s = %s:get_flow\n'
                % (PLUGIN, PLUGIN))
    return {PLUGIN: {'record_file': record_file}}


class Notifications(object):
    """oslo.messaging notification endpoint that keeps what it gets."""

    def __init__(self):
        self.events = []
        self.cond = threading.Condition()

    def _keep(self, priority, publisher_id, event_type, payload):
        with self.cond:
            self.events.append((priority, publisher_id, event_type, payload))
            self.cond.notify_all()

    def info(self, ctxt, publisher_id, event_type, payload, metadata):
        self._keep('info', publisher_id, event_type, payload)

    def warn(self, ctxt, publisher_id, event_type, payload, metadata):
        self._keep('warn', publisher_id, event_type, payload)

    def error(self, ctxt, publisher_id, event_type, payload, metadata):
        self._keep('error', publisher_id, event_type, payload)

    def find(self, event_type, image_id):
        return [e for e in self.events if e[2] == event_type and
                isinstance(e[3], dict) and e[3].get('id') == image_id]

    def wait(self, event_type, image_id, timeout=30):
        deadline = time.time() + timeout
        with self.cond:
            while not self.find(event_type, image_id):
                left = deadline - time.time()
                if left <= 0:
                    return []
                self.cond.wait(left)
            return self.find(event_type, image_id)


def start_listener(transport_url, endpoint):
    from oslo_config import cfg
    import oslo_messaging
    conf = cfg.ConfigOpts()
    conf([], project='vmar-glance-smoke')
    transport = oslo_messaging.get_notification_transport(
        conf, url=transport_url)
    listener = oslo_messaging.get_notification_listener(
        transport,
        [oslo_messaging.Target(exchange='glance', topic='notifications')],
        [endpoint], executor='threading', pool=POOL)
    listener.start()
    return listener, transport


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def start_http(directory):
    server = http.server.ThreadingHTTPServer(
        ('127.0.0.1', 0), functools.partial(QuietHandler,
                                            directory=directory))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return server


class Smoke(object):

    def __init__(self, work_dir):
        self.work_dir = work_dir
        self.failures = []
        self.timings = {}

    def check(self, ok, what):
        print('%s %s' % ('PASS' if ok else 'FAIL', what), flush=True)
        if not ok:
            self.failures.append(what)
        return ok

    def cli_json(self, glance, *args):
        t0 = time.time()
        out = glance.openstack(*(args + ('-f', 'json'))).stdout
        self.timings.setdefault('cli', []).append(time.time() - t0)
        return json.loads(out)

    def wait_active(self, gc, image_id, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            image = gc.images.get(image_id)
            if image.status == 'active':
                return image
            if image.status in ('killed', 'deleted') or image.get(
                    'os_glance_failed_import'):
                break
            time.sleep(0.3)
        print('   image %s stuck: %s' % (image_id, dict(image)))
        return None

    # -- part 1 --------------------------------------------------------------

    def part1(self, rabbit, data_dir, raw, raw_bytes):
        glance = glance_env.GlanceAPI(
            os.path.join(self.work_dir, 'glance1'), rabbit.transport_url)
        glance.start()
        self.timings['glance_start'] = glance.startup_seconds
        print('glance-api up in %.1fs at %s' % (glance.startup_seconds,
                                                glance.endpoint))
        notes = Notifications()
        listener, transport = start_listener(rabbit.transport_url, notes)
        http_server = start_http(data_dir)
        try:
            gc = glance.glanceclient()
            images = {}

            image = self.cli_json(
                glance, 'image', 'create', '--file', raw, '--disk-format',
                'raw', '--container-format', 'bare', 'smoke-upload')
            images['upload'] = image['id']

            image = self.cli_json(
                glance, 'image', 'create', '--import', '--file', raw,
                '--disk-format', 'raw', '--container-format', 'bare',
                'smoke-glance-direct')
            images['glance-direct'] = image['id']

            image = self.cli_json(
                glance, 'image', 'create', '--disk-format', 'raw',
                '--container-format', 'bare', 'smoke-web-download')
            images['web-download'] = image['id']
            uri = 'http://127.0.0.1:%d/%s' % (http_server.server_address[1],
                                              os.path.basename(raw))
            glance.openstack('image', 'import', image['id'], '--method',
                             'web-download', '--uri', uri)

            for how, image_id in images.items():
                image = self.wait_active(gc, image_id)
                if not self.check(image is not None,
                                  '%s image %s active' % (how, image_id)):
                    continue
                data = b''.join(gc.images.data(image_id))
                self.check(data == raw_bytes,
                           '%s image downloaded with glanceclient equals '
                           'the file (%d bytes)' % (how, len(data)))
                for event in ('image.upload', 'image.activate'):
                    self.check(notes.wait(event, image_id),
                               '%s: %s notification' % (how, event))

            glance.openstack('image', 'delete', images['upload'])
            self.check(notes.wait('image.delete', images['upload']),
                       'image.delete notification after openstack image '
                       'delete')
            time.sleep(1)  # let stragglers arrive before printing

            print('\nNotifications (exchange glance, topic notifications, '
                  'pool %s):' % POOL)
            names = {v: k for k, v in images.items()}
            for prio, publisher, event_type, payload in list(notes.events):
                who = names.get(payload.get('id'), '?') if isinstance(
                    payload, dict) else '?'
                keys = sorted(payload) if isinstance(payload, dict) else (
                    type(payload).__name__)
                print('  %-5s %-16s %-22s %-14s keys=%s' % (
                    prio, publisher, event_type, who, keys))
            seen = {}
            for _, _, event_type, payload in notes.events:
                if isinstance(payload, dict):
                    seen.setdefault(event_type, payload)
            for event_type in ('image.upload', 'image.activate',
                               'image.delete'):
                if event_type in seen:
                    p = seen[event_type]
                    print('  sample %s: %s' % (event_type, json.dumps(
                        {k: p[k] for k in sorted(p) if k not in ('tags',)},
                        default=str)))
        finally:
            listener.stop()
            listener.wait()
            transport.cleanup()
            http_server.shutdown()
            http_server.server_close()
            glance.stop()

    # -- part 2 --------------------------------------------------------------

    def part2(self, rabbit, data_dir, raw, raw_bytes):
        plugin_root = tempfile.mkdtemp(prefix='vmar-smoke-plugin-')
        record = os.path.join(self.work_dir, 'plugin-record.jsonl')
        import_config = write_plugin(plugin_root, record)
        glance = glance_env.GlanceAPI(
            os.path.join(self.work_dir, 'glance2'), rabbit.transport_url,
            import_plugins=[PLUGIN], import_config=import_config,
            python_path=[plugin_root])
        http_server = start_http(data_dir)
        try:
            glance.start()
            gc = glance.glanceclient()
            direct = self.cli_json(
                glance, 'image', 'create', '--import', '--file', raw,
                '--disk-format', 'raw', '--container-format', 'bare',
                'smoke-plugin-direct')['id']
            web = self.cli_json(
                glance, 'image', 'create', '--disk-format', 'raw',
                '--container-format', 'bare', 'smoke-plugin-web')['id']
            glance.openstack(
                'image', 'import', web, '--method', 'web-download', '--uri',
                'http://127.0.0.1:%d/%s' % (http_server.server_address[1],
                                            os.path.basename(raw)))
            plain = self.cli_json(
                glance, 'image', 'create', '--file', raw, '--disk-format',
                'raw', '--container-format', 'bare', 'smoke-plugin-plain')[
                    'id']
            sha = hashlib.sha256(raw_bytes).hexdigest()
            for how, image_id in (('glance-direct', direct),
                                  ('web-download', web)):
                image = self.wait_active(gc, image_id)
                if not self.check(image is not None,
                                  'plugin run: %s image active' % how):
                    continue
                self.check(image.get('vmar_probe') == 'ran' and
                           image.get('vmar_probe_sha256') == sha,
                           'plugin set properties via action_wrapper on %s '
                           'image' % how)
                self.check('os_glance_vmar_probe' not in image,
                           'os_glance_* property from plugin dropped (%s)'
                           % how)
            image = self.wait_active(gc, plain)
            self.check(image is not None and 'vmar_probe' not in image,
                       'plain upload (PUT /file) ran no import plugin')

            entries = []
            if os.path.exists(record):
                with open(record) as f:
                    entries = [json.loads(line) for line in f]
            flows = [e for e in entries if e['where'] == 'get_flow']
            execs = [e for e in entries if e['where'] == 'execute']
            self.check(len(flows) == 2 and len(execs) == 2,
                       'plugin get_flow and execute each ran twice (got '
                       '%d/%d)' % (len(flows), len(execs)))
            self.check(all(e.get('exists') and e.get('sha256') == sha
                           for e in execs),
                       'plugin execute got the staged file with the right '
                       'bytes')
            print('\nPlugin record:')
            for e in entries:
                print('  ' + json.dumps(e, sort_keys=True))
        finally:
            http_server.shutdown()
            http_server.server_close()
            glance.stop()
            shutil.rmtree(plugin_root, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--keep', action='store_true',
                        help='keep the work dir')
    parser.add_argument('--skip-plugin', action='store_true',
                        help='skip part 2 (throwaway import plugin)')
    args = parser.parse_args()

    work_dir = tempfile.mkdtemp(prefix='vmar-glance-smoke-')
    data_dir = os.path.join(work_dir, 'data')
    os.makedirs(data_dir)
    raw = os.path.join(data_dir, 'small.raw')
    raw_bytes = os.urandom(3 * 1024 * 1024 + 512)
    with open(raw, 'wb') as f:
        f.write(raw_bytes)

    smoke = Smoke(work_dir)
    rabbit = glance_env.RabbitMQ(os.path.join(work_dir, 'rabbitmq'))
    try:
        rabbit.start()
        smoke.timings['rabbit_start'] = rabbit.startup_seconds
        print('RabbitMQ up in %.1fs: %s' % (rabbit.startup_seconds,
                                            rabbit.transport_url))
        smoke.part1(rabbit, data_dir, raw, raw_bytes)
        if not args.skip_plugin:
            smoke.part2(rabbit, data_dir, raw, raw_bytes)
    except Exception as e:
        import traceback
        traceback.print_exc()
        smoke.check(False, 'unexpected error: %s' % e)
    finally:
        rabbit.stop()

    left = list(glance_env._proc_owner_tags())
    left = [(pid, tag) for pid, tag in left
            if tag.startswith('%d:' % os.getpid())]
    smoke.check(not left, 'no harness processes left (%s)' % left)
    cli = smoke.timings.get('cli', [])
    print('\nTimings: rabbit start %.1fs, glance start %.1fs, openstack CLI '
          'calls %.1f-%.1fs' % (
              smoke.timings.get('rabbit_start') or 0,
              smoke.timings.get('glance_start') or 0,
              min(cli or [0]), max(cli or [0])))
    if smoke.failures or args.keep:
        print('work dir kept: %s' % work_dir)
    else:
        shutil.rmtree(work_dir, ignore_errors=True)
    if smoke.failures:
        print('\n%d check(s) FAILED:' % len(smoke.failures))
        for failure in smoke.failures:
            print('  - ' + failure)
        return 1
    print('\nALL OK')
    return 0


if __name__ == '__main__':
    sys.exit(main())
