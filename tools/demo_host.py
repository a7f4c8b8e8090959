#!/usr/bin/env python3
"""The demo's host side: vmar-export serving two images, and the page cache.

``run`` takes a library that ``vmar-manage`` has ingested (its config file)
and the patched QEMU (``qemu/build.sh`` prints its prefix), and:

1. writes ``vmar-host.conf`` into the library's state dir (``[vmar_host]
   host_dir = <state>/host``, emptied first; ``map_source = dir`` reading
   the library, ``base_fetch = full``; ``export_socket``;
   ``qemu_storage_daemon`` from the prefix) and starts ``vmar-export
   serve`` in the background, in a session of its own;
2. exports two similar images (``vmar-export add``; default: minbase and
   python3) while the disk holding ``host_dir`` has the kernel's default
   read-ahead, 128 KiB (doc/source/admin/export.rst: keep it moderate there; a
   file keeps the read-ahead it was opened with, and the machine's own
   setting is put back right after the adds);
3. empties the page cache of the files it measures (``POSIX_FADV_DONTNEED``
   of each: the machine's other pages are left alone), reads both images
   in full through their NBD exports (``qemu-io -f raw``, every byte) and
   at once measures with ``fincore`` how many bytes of each base file in
   ``host_dir`` are cached;
   if the disk's own read-ahead is not 128 KiB, exports them again under
   it (``remove``, ``add``) and measures that way too;
4. empties it of them again, reads the two plain raw image files in full
   with the same reader and measures them the same way;
5. prints each way next to the unique-block limit: the bytes of the
   distinct non-zero 4 KiB blocks of the two images, from the library
   database (the fingerprint digests ingest stored);
6. checks that each export reads back equal to its raw file
   (``qemu-img compare``);
7. writes a PNG chart: (a) the library's sharing histogram (the paper's
   Fig. 12b), (b) the map size per image, (c) the page cache each way
   against the limit, and prints ``chart: <path>``. The text output carries
   the same numbers.

Whatever happens (an error, Ctrl-C, SIGTERM), ``vmar-export serve`` and its
qemu-storage-daemon are stopped, and the read-ahead is put back, before the
tool exits. ``stop`` undoes what an earlier ``run`` left behind (one killed
with SIGKILL, say), found by the files it notes in the state dir.

The machine reclaims idle page cache on its own (DAMON ``pageout`` of pages
idle for about a minute), so each way is measured within seconds of its
reads, and the DAMON settings are printed next to the figures.

Needs root (the read-ahead knob), ``fincore`` (util-linux) and
matplotlib (``demo-requirements.txt``).

Usage::

    demo_host.py run --config-file STATE/vmar.conf --qemu-prefix PREFIX \\
        --image NAME UUID PATH [--image ...] [--pair NAME NAME]
    demo_host.py stop --state STATE
"""

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
from oslo_config import cfg

from vmar_openstack import conf as vmar_conf
from vmar_openstack.db import api as db_api
from vmar_openstack.db import session as db_session
from vmar_openstack.db import store as db_store
from vmar_openstack.fingerprint import keys as fp_keys
from vmar_openstack.host.cache import pagecache

HOST_CONF = 'vmar-host.conf'
SERVE_PID = 'vmar-export-serve.pid'
READAHEAD_NOTE = 'readahead-to-restore.json'
CHART = 'demo-host.png'
READ_CHUNK = 64 << 20
DEFAULT_READAHEAD_KB = 128      # the kernel's default
DAMON = '/sys/kernel/mm/damon/admin/kdamonds'
MiB = float(1 << 20)


class DemoError(RuntimeError):
    """A step of the demo failed (the message says which)."""


# -- small helpers -----------------------------------------------------------

def _cli(name):
    """The console script ``name`` of this Python's environment."""
    script = os.path.join(os.path.dirname(sys.executable), name)
    if os.access(script, os.X_OK):
        return [script]
    module = {'vmar-export': 'export', 'vmar-manage': 'manage'}[name]
    return [sys.executable, '-m', 'vmar_openstack.cmd.' + module]


def _run(cmd, what):
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        raise DemoError('%s failed (%d): %s' % (
            what, proc.returncode, (proc.stderr or proc.stdout).strip()))
    return proc.stdout


def library_conf(path):
    """The library's configuration, read from its config file."""
    conf = cfg.ConfigOpts()
    vmar_conf.register_opts(conf)
    conf([], project='vmar', default_config_files=[path])
    return conf


@contextlib.contextmanager
def readahead(knob, kb, state):
    """Set the disk's read-ahead to ``kb`` KiB; put it back afterwards.

    The old setting is noted in ``state`` first, so that ``stop`` can put
    it back after a run that was killed hard.
    """
    if knob is None or kb is None:
        yield
        return
    with pagecache.knob_held(knob):
        old = pagecache.read_knob(knob)
        note = os.path.join(state, READAHEAD_NOTE)
        with open(note + '.tmp', 'w') as f:
            json.dump({'knob': knob, 'kb': old}, f)
        os.rename(note + '.tmp', note)
        try:
            pagecache.write_knob(knob, kb)
            yield
        finally:
            _put_back(note, old_value=old, knob=knob)


def _put_back(note, old_value, knob):
    """Write back a noted read-ahead (the knob held), forget the note."""
    pagecache.write_knob(knob, old_value)
    os.unlink(note)


def restore_readahead(state):
    """Put back a read-ahead noted in ``state``; returns it, or None.

    Holding the knob (:func:`pagecache.knob_held`), as whoever changes it
    does: a measurement of another process's may hold it right now.
    """
    note = os.path.join(state, READAHEAD_NOTE)
    try:
        with open(note) as f:
            saved = json.load(f)
    except (OSError, ValueError):
        return None
    with pagecache.knob_held(saved['knob']):
        _put_back(note, saved['kb'], saved['knob'])
    return saved


def read_all(qemu_io, target, size):
    """Read every byte of ``target`` (a file or an NBD URI), as raw.

    ``qemu-io`` asks for each byte in 64 MiB requests; nothing is skipped
    (``qemu-img convert`` would skip what block status reports as zero).
    Returns the seconds taken.
    """
    cmds = []
    for off in range(0, size, READ_CHUNK):
        cmds += ['-c', 'read -q %d %d' % (off, min(READ_CHUNK, size - off))]
    t = time.monotonic()
    out = _run([qemu_io, '-f', 'raw', '-r'] + cmds + [target],
               'qemu-io read of %s' % target)
    if 'error' in out.lower() or 'failed' in out.lower():
        raise DemoError('qemu-io read of %s: %s' % (target, out.strip()))
    return time.monotonic() - t


def damon_settings():
    """The DAMON pageout scheme of this machine, in one line (or None)."""
    base = os.path.join(DAMON, '0')

    def get(rel):
        with open(os.path.join(base, rel)) as f:
            return f.read().strip()
    try:
        state = get('state')
        ctx = 'contexts/0/'
        aggr = int(get(ctx + 'monitoring_attrs/intervals/aggr_us'))
        action = get(ctx + 'schemes/0/action')
        min_age = int(get(ctx + 'schemes/0/access_pattern/age/min'))
    except (OSError, ValueError):
        return None
    return ('DAMON %s: %s of pages idle for %d aggregation intervals of '
            '%.0f s (%.0f s)' % (state, action, min_age, aggr / 1e6,
                                 min_age * aggr / 1e6))


# -- the library's figures ---------------------------------------------------

def library_stats(config_file):
    """``vmar-manage stats --json`` of the library."""
    return json.loads(_run(_cli('vmar-manage') + [
        '--config-file', config_file, 'stats', '--json'],
        'vmar-manage stats'))


def unique_limit(conf, image_ids):
    """The unique-block limit of the images, from the library database.

    From the digest lists ingest stored: a block counts when it is not all
    zeros (nor a partial last block), and two blocks are the same when
    their fingerprints are. Returns ``{'bytes', 'blocks', 'block_size',
    'data_bytes': {image_id: bytes of its non-zero blocks}}``.
    """
    keys, block_size, data = [], None, {}
    with db_session.reader(conf) as s:
        store = db_store.ClusterStore(s)
        for image_id in image_ids:
            img = db_api.get_image(s, image_id)
            if img is None:
                raise DemoError('image %s is not in the library' % image_id)
            keys.append(fp_keys.image_key_set(img, store.load_digests(img)))
            if block_size not in (None, img.block_size):
                raise DemoError('the images have different block sizes')
            block_size = img.block_size
            data[image_id] = (img.n_blocks - img.zero_blocks) * block_size
    n = len(fp_keys.unique(np.concatenate(keys)))
    return {'bytes': n * block_size, 'blocks': n, 'block_size': block_size,
            'data_bytes': data}


# -- vmar-export --------------------------------------------------------------

class HostSide:
    """``vmar-export serve`` with its own config, as a context manager.

    Leaving the context (normally, on an error or on a signal turned into
    an exception) stops ``serve`` with SIGTERM, which quits its daemon, and
    then kills whatever of that session is still alive.
    """

    def __init__(self, state, library_state, qemu_prefix, socket=None,
                 log_file=None):
        self.state = state
        self.host_dir = os.path.join(state, 'host')
        self.socket = socket or os.path.join(self.host_dir, 'nbd.sock')
        self.conf_file = os.path.join(state, HOST_CONF)
        self.qemu_prefix = qemu_prefix
        self.library_state = library_state
        self.log_file = log_file or os.path.join(state, 'vmar-export.log')
        self.proc = None
        self.left = None

    def write_conf(self):
        os.makedirs(self.host_dir, exist_ok=True)
        with open(self.conf_file, 'w') as f:
            f.write('[DEFAULT]\nlog_file = %s\n\n'
                    '[vmar_host]\nhost_dir = %s\nexport_socket = %s\n'
                    'qemu_storage_daemon = %s\n'
                    'map_source = dir\nmap_source_dir = %s\n'
                    # the library is on this disk: whole bases, whose page
                    # cache the demo measures (lazy mirrors are for remote
                    # stores)
                    'base_fetch = full\n'
                    % (self.log_file, self.host_dir, self.socket,
                       os.path.join(self.qemu_prefix, 'bin',
                                    'qemu-storage-daemon'),
                       self.library_state))

    def export_cli(self, *args):
        return _run(_cli('vmar-export') + ['--config-file', self.conf_file]
                    + list(args), 'vmar-export ' + ' '.join(args))

    def __enter__(self):
        # a fresh host_dir: no export of an earlier run is restored
        shutil.rmtree(self.host_dir, ignore_errors=True)
        self.write_conf()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket)
        out = open(self.log_file + '.out', 'ab')
        try:
            self.proc = subprocess.Popen(
                _cli('vmar-export') + ['--config-file', self.conf_file,
                                       'serve'],
                stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                start_new_session=True)
        finally:
            out.close()
        with open(os.path.join(self.state, SERVE_PID), 'w') as f:
            f.write('%d\n' % self.proc.pid)
        try:
            deadline = time.monotonic() + 60
            while not os.path.exists(self.socket):
                if self.proc.poll() is not None:
                    raise DemoError('vmar-export serve exited with %d; see %s'
                                    % (self.proc.returncode, self.log_file))
                if time.monotonic() > deadline:
                    raise DemoError('vmar-export serve did not publish %s '
                                    'within 60 s' % self.socket)
                time.sleep(0.05)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc):
        self.stop()

    def add(self, image_id):
        """Export the current map of an image; returns its NBD URI."""
        out = self.export_cli('add', image_id, '--holder', 'demo')
        m = re.search(r'nbd\+unix://\S+', out)
        if not m:
            raise DemoError('vmar-export add printed no URI: %s' % out)
        return m.group(0)

    def remove(self, image_id):
        self.export_cli('remove', image_id, '--holder', 'demo')

    def base_files(self):
        d = os.path.join(self.host_dir, 'bases')
        return sorted(os.path.join(d, n) for n in os.listdir(d)
                      if not n.startswith('.'))

    def stop(self):
        """Stop serve and its daemon; sets ``left`` (pids still alive)."""
        if self.proc is None:
            return
        self.left = stop_session(self.proc.pid, self.proc, self.host_dir)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(self.state, SERVE_PID))
        self.proc = None


def _alive(pid):
    """Whether ``pid`` runs (a zombie waiting to be reaped does not)."""
    try:
        with open('/proc/%d/stat' % pid) as f:
            return f.read().rsplit(')', 1)[1].split()[0] != 'Z'
    except (OSError, IndexError):
        return False


def _session_members(sid):
    pids = []
    for name in os.listdir('/proc'):
        if name.isdigit():
            with contextlib.suppress(OSError):
                if os.getsid(int(name)) == sid and _alive(int(name)):
                    pids.append(int(name))
    return pids


def _cmdline(pid):
    try:
        with open('/proc/%d/cmdline' % pid, 'rb') as f:
            return f.read().replace(b'\0', b' ').decode(errors='replace')
    except OSError:
        return ''


def stop_session(sid, proc=None, host_dir=None, timeout=30):
    """Stop ``vmar-export serve`` and its session; returns pids left.

    ``sid`` is serve's pid: it leads a session of its own. SIGTERM makes
    serve quit its qemu-storage-daemon over QMP and exit. Any member of
    that session still there afterwards (the daemon, if serve was killed
    hard) is killed by its pid.
    """
    if proc is not None:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    elif 'vmar-export' in _cmdline(sid) and os.getsid(sid) == sid:
        os.kill(sid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _alive(sid) and time.monotonic() < deadline:
            time.sleep(0.1)
    deadline = time.monotonic() + 10
    while True:
        members = _session_members(sid)
        if not members or time.monotonic() > deadline:
            break
        for pid in members:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    if host_dir:
        # its pid file names a daemon of this session only if it was ours
        with contextlib.suppress(OSError, ValueError):
            with open(os.path.join(host_dir, 'qsd.pid')) as f:
                pid = int(f.read())
            if os.getsid(pid) == sid and _alive(pid):
                members.append(pid)
    return sorted(set(members))


def stop_leftovers(state):
    """Undo what an earlier run left; returns what was done, in lines.

    Stops its ``vmar-export serve`` (found by its pid file) and puts back
    the read-ahead it had changed.
    """
    done = []
    path = os.path.join(state, SERVE_PID)
    try:
        with open(path) as f:
            sid = int(f.read())
    except (OSError, ValueError):
        sid = None
    if sid is not None:
        if _alive(sid) and 'vmar-export' in _cmdline(sid):
            left = stop_session(sid, host_dir=os.path.join(state, 'host'))
            done.append('stopped vmar-export serve %d left by an earlier '
                        'run%s' % (sid, ' (still alive: %s)' % left
                                   if left else ''))
        os.unlink(path)
    saved = restore_readahead(state)
    if saved:
        done.append('put back the read-ahead an earlier run had changed: '
                    '%d KiB in %s' % (saved['kb'], saved['knob']))
    return done


# -- the run ------------------------------------------------------------------

def measure(qemu_io, pair, targets, files, sizes):
    """Evict ``files()``, read each image in full, measure ``files()``.

    Returns {'files': [{'file', 'cached', 'size'}], 'read_s',
    'measured_after_s'}.
    """
    paths = files()
    pagecache.evict_all(paths)
    t0 = time.monotonic()
    secs = {n: read_all(qemu_io, targets[n], sizes[n]) for n in pair}
    cached = pagecache.resident_bytes(paths)
    return {'files': [{'file': p, 'cached': cached[p],
                       'size': os.path.getsize(p)} for p in paths],
            'read_s': secs, 'measured_after_s': time.monotonic() - t0}


def chart(path, hist, maps, cache, ra_of, limit, pair):
    """The three panels as a PNG (matplotlib, Agg: no display needed)."""
    try:
        import matplotlib
    except ImportError:
        raise DemoError('matplotlib is missing: pip install -r '
                        'demo-requirements.txt')
    matplotlib.use('Agg')
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib import pyplot as plt

    fig, (ax_a, ax_b, ax_c) = plt.subplots(
        1, 3, figsize=(18, 5.8), gridspec_kw={'width_ratios': [1, 1, 1.4]})
    ks = sorted(hist)
    bars = ax_a.bar([str(k) for k in ks], [hist[k] for k in ks],
                    color='tab:blue')
    ax_a.bar_label(bars, labels=['%d\n%.1f MiB' % (hist[k],
                                                   hist[k] * 4096 / MiB)
                                 for k in ks], fontsize=8)
    ax_a.set_title('(a) sharing: distinct non-zero 4 KiB blocks\n'
                   'by the number of library images holding them')
    ax_a.set_xlabel('images holding the block')
    ax_a.set_ylabel('distinct blocks')
    ax_a.margins(y=0.2)

    bars = ax_b.bar([m['image'] for m in maps],
                    [m['map_bytes'] / 1024 for m in maps], color='tab:green')
    ax_b.bar_label(bars, labels=['%.1f KiB\n%.3f MB/GiB'
                                 % (m['map_bytes'] / 1024, m['mb_per_gib'])
                                 for m in maps], fontsize=8)
    ax_b.set_title('(b) map size per image\n(order of ingest)')
    ax_b.set_ylabel('map file (KiB)')
    ax_b.margins(y=0.2)

    colors = dict(zip(pair, ('tab:orange', 'tab:purple')))
    other = iter(['tab:olive', 'tab:cyan', 'tab:brown', 'tab:pink'] * 9)
    seg = {w: [(f['cached'], colors.get(f['image']) or next(other), None)
               for f in cache[w]] for w in cache if w != 'raw'}
    # raw files: their non-zero data first, then the zero pages
    data = [(min(f['cached'], f['data']), colors[f['image']], None)
            for f in cache['raw']]
    zero = [(f['cached'] - min(f['cached'], f['data']), colors[f['image']],
             '//') for f in cache['raw']]
    seg['raw'] = data + zero
    ways = []
    for w in cache:
        ra = ra_of[w]
        if w == 'raw':
            ways.append((w, 'via the raw files'))
        else:
            ways.append((w, 'via the exports\nread-ahead %s' % (
                '%d KiB' % ra if ra is not None else 'n/a')))
    for x, (way, _label) in enumerate(ways):
        bottom = 0.0
        for got, color, hatch in seg[way]:
            ax_c.bar(x, got / MiB, bottom=bottom, width=0.6, color=color,
                     alpha=0.35 if hatch else 1.0, hatch=hatch,
                     edgecolor='white' if not hatch else color)
            bottom += got / MiB
        ax_c.text(x, bottom, '%.1f MiB\n= %.2f x limit' % (
            bottom, bottom * MiB / limit if limit else 0), ha='center',
            va='bottom', fontsize=8,
            bbox={'facecolor': 'white', 'edgecolor': 'none', 'pad': 1})
    ax_c.axhline(limit / MiB, color='black', linestyle='--', linewidth=1)
    handles = [Patch(color=colors[n], label=n) for n in pair]
    handles.append(Patch(facecolor='white', edgecolor='grey', hatch='//',
                         label='zero pages of the raw files'))
    handles.append(Line2D([], [], color='black', linestyle='--',
                          label='unique-block limit %.1f MiB'
                          % (limit / MiB)))
    ax_c.legend(handles=handles, loc='upper left', fontsize=8)
    ax_c.set_xticks(range(len(ways)), [w[1] for w in ways])
    ax_c.set_xlim(-0.6, len(ways) - 0.4)
    ax_c.set_title('(c) host page cache after reading\n%s and %s in full'
                   % tuple(pair))
    ax_c.set_ylabel('cached (MiB)')
    ax_c.margins(y=0.25)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _mib(n):
    return '%.1f MiB' % (n / MiB)


def print_library(hist, maps):
    print("sharing histogram of the library (the paper's Fig. 12b): "
          "distinct non-zero 4 KiB blocks")
    print('by the number of images holding them')
    print('%8s %10s %10s' % ('images', 'blocks', 'MiB'))
    for k in sorted(hist):
        print('%8d %10d %10.1f' % (k, hist[k], hist[k] * 4096 / MiB))
    print()
    print('map size per image')
    print('%-12s %14s %10s %10s' % ('image', 'virtual size', 'map bytes',
                                    'MB/GiB'))
    for m in maps:
        print('%-12s %14d %10d %10.3f' % (m['image'], m['virtual_size'],
                                          m['map_bytes'], m['mb_per_gib']))
    print()


def _title(way, res):
    if way in ('export', 'raw'):
        return way
    return 'export RA %dK' % res[way]['readahead_kb']


def print_cache(res, pair, limit):
    print('host page cache after reading %s and %s in full, every byte '
          '(qemu-io -f raw),' % tuple(pair))
    print('each way right after emptying the page cache of the files '
          'measured (fadvise DONTNEED) and reading')
    ra = res['export']['readahead_kb']
    if ra is None:
        print('read-ahead: n/a (host_dir is not on a block device)')
    else:
        print('read-ahead: the daemon opened the base files with %d KiB%s'
              % (ra, ', the kernel default' if ra == DEFAULT_READAHEAD_KB
                 else " (this disk's own; it cannot be changed here)"
                 if len(res) == 2 else ''))
        print('(doc/source/admin/export.rst: keep it moderate on the disk of '
              'host_dir)')
        for w in res:
            if w not in ('export', 'raw'):
                print("'%s': the same with this disk's own read-ahead, "
                      '%d KiB' % (_title(w, res), res[w]['readahead_kb']))
    print('%-16s %-18s %13s %13s %8s' % ('way', 'file', 'cached bytes',
                                         'file size', 'cached'))
    totals = {}
    for way in res:
        t = _title(way, res)
        for f in res[way]['files']:
            print('%-16s %-18s %13d %13d %7.1f%%' % (
                t, f['label'], f['cached'], f['size'],
                100.0 * f['cached'] / f['size'] if f['size'] else 0))
        totals[way] = sum(f['cached'] for f in res[way]['files'])
        size = sum(f['size'] for f in res[way]['files'])
        print('%-16s %-18s %13d %13d %7.1f%%' % (
            t, 'total', totals[way], size,
            100.0 * totals[way] / size if size else 0))
    print('(export: the base files in host_dir; raw: the image files in %s)'
          % ', '.join(sorted({os.path.dirname(f['file'])
                              for f in res['raw']['files']})))
    print()
    lim = limit['bytes']

    def times(n):
        return '%13d bytes (%s) = %5.2f x the limit' % (
            n, _mib(n), n / lim if lim else 0)
    print('unique-block limit: %d bytes (%s): the %d distinct non-zero '
          '4 KiB blocks' % (lim, _mib(lim), limit['blocks']))
    print('of %s and %s, from the library database (the fingerprints '
          'ingest stored)' % tuple(pair))
    for way in res:
        print('  %-16s %s' % (_title(way, res), times(totals[way])))
    data = sum(limit['data_bytes'].values())
    print('  for reference, the non-zero blocks of the two images counted '
          'apart:')
    print('  %-16s %s' % ('', times(data)))
    print('  (reading a raw file caches every page it reads, zero pages '
          'included;')
    print('  an export reads no base file for a zero block, and each shared '
          'block from one file;')
    print('  read-ahead adds neighbours of the blocks read, second copies '
          'included)')
    for way in res:
        print('  %-16s read in %.1f s, measured %.1f s after the first read '
              'began' % (_title(way, res), sum(res[way]['read_s'].values()),
                         res[way]['measured_after_s']))
    return totals


def run(args):
    conf = library_conf(args.config_file)
    lib_state = conf.vmar.state_dir
    state = args.state or lib_state
    images = {name: {'id': image_id, 'path': path}
              for name, image_id, path in args.image}
    pair = args.pair
    for n in pair:
        if n not in images:
            raise DemoError('--pair names %s, which no --image gives' % n)
    name_of = {v['id']: n for n, v in images.items()}
    qemu_io = os.path.join(args.qemu_prefix, 'bin', 'qemu-io')
    qemu_img = os.path.join(args.qemu_prefix, 'bin', 'qemu-img')

    st = library_stats(args.config_file)
    hist = {int(k): v for k, v in st['fingerprints_by_images'].items()}
    maps = [{'image': name_of.get(i['image_id'], i['image_id'][:8]),
             'image_id': i['image_id'], 'virtual_size': i['virtual_size'],
             'map_bytes': i['map_bytes'], 'mb_per_gib': i['map_mb_per_gib']}
            for i in st['images']]
    print_library(hist, maps)

    limit = unique_limit(conf, [images[n]['id'] for n in pair])
    sizes = {n: os.path.getsize(images[n]['path']) for n in pair}
    raws = {n: images[n]['path'] for n in pair}
    # A file's read-ahead is fixed when it is opened, so the daemon opens
    # the base files (vmar-export add) under the read-ahead of each way.
    knob = pagecache.readahead_knob(state)
    machine_ra = None
    if knob:
        # the disk's own setting, read while nobody else's measurement
        # has it changed (they hold the knob while they do)
        with pagecache.knob_held(knob):
            machine_ra = pagecache.read_knob(knob)
    settable = knob and os.access(knob, os.W_OK)
    # (way, read-ahead to set for the adds, read-ahead the files get)
    plan = [('export', None, machine_ra)]
    if settable and machine_ra != DEFAULT_READAHEAD_KB:
        plan = [('export', DEFAULT_READAHEAD_KB, DEFAULT_READAHEAD_KB),
                ('export_ra%d' % machine_ra, machine_ra, machine_ra)]
    pids, res = {}, {}
    with HostSide(state, lib_state, args.qemu_prefix,
                  socket=args.socket) as host:
        pids['serve'] = host.proc.pid
        print('vmar-export serve: pid %d, config %s' % (host.proc.pid,
                                                        host.conf_file))
        for i, (way, kb, got_kb) in enumerate(plan):
            if i:
                for n in pair:
                    host.remove(images[n]['id'])
            uris = {}
            with readahead(knob, kb, state):
                for n in pair:
                    uris[n] = host.add(images[n]['id'])
                    if not i:
                        print('exported %s: %s' % (n, uris[n]))
            res[way] = measure(qemu_io, pair, uris, host.base_files, sizes)
            res[way]['readahead_kb'] = got_kb
        with open(os.path.join(host.host_dir, 'qsd.pid')) as f:
            pids['daemon'] = int(f.read())
        res['raw'] = measure(qemu_io, pair, raws,
                             lambda: [raws[n] for n in pair], sizes)
        res['raw']['readahead_kb'] = machine_ra
        for n in pair:
            proc = subprocess.run(
                [qemu_img, 'compare', '-f', 'raw', '-F', 'raw', uris[n],
                 raws[n]], capture_output=True, text=True)
            if proc.returncode:
                raise DemoError('the export of %s differs from %s: %s' % (
                    n, raws[n], (proc.stdout + proc.stderr).strip()))
        # host_dir keeps no copy of the maps and bases
        for n in pair:
            host.remove(images[n]['id'])
        print()
    if host.left:
        raise DemoError('processes of vmar-export still alive: %s'
                        % host.left)
    for f in (f for w in res if w != 'raw' for f in res[w]['files']):
        base = os.path.basename(f['file'])
        f['image'] = name_of.get(base, base[:8])
        f['label'] = 'base of %s' % f['image']
    for n, f in zip(pair, res['raw']['files']):
        f['image'] = n
        f['label'] = os.path.basename(f['file'])
        f['data'] = limit['data_bytes'][images[n]['id']]
    totals = print_cache(res, pair, limit)
    damon = damon_settings()
    if damon:
        print('  ' + damon)
    print('exports read back equal to the raw files (qemu-img compare): '
          '%s' % ', '.join(pair))
    print('vmar-export and its qemu-storage-daemon stopped (pids %d, %d)'
          % (pids['serve'], pids['daemon']))
    path = os.path.join(state, CHART)
    chart(path, hist, maps, {w: res[w]['files'] for w in res},
          {w: res[w]['readahead_kb'] for w in res}, limit['bytes'], pair)
    if args.json:
        with open(args.json, 'w') as f:
            json.dump({'histogram': hist, 'maps': maps, 'cache': res,
                       'totals': totals, 'limit_bytes': limit['bytes'],
                       'limit_blocks': limit['blocks'],
                       'data_bytes': limit['data_bytes'], 'pair': pair,
                       'pids': pids, 'damon': damon, 'chart': path},
                      f, indent=1)
    print('chart: %s' % path)
    return 0


def _terminate(signum, frame):
    # turn SIGTERM/SIGHUP into an exception, so every cleanup runs
    raise KeyboardInterrupt('signal %d' % signum)


def main(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split('\n', 2)[2])
    sub = p.add_subparsers(dest='command', required=True)
    r = sub.add_parser('run', help='export two images and compare caches')
    r.add_argument('--config-file', required=True,
                   help="the library's vmar.conf (state_dir, database)")
    r.add_argument('--qemu-prefix', required=True,
                   help='prefix of the patched QEMU (qemu/build.sh)')
    r.add_argument('--image', nargs=3, action='append', required=True,
                   metavar=('NAME', 'UUID', 'PATH'),
                   help='a library image: its name, id and raw file')
    r.add_argument('--pair', nargs=2, default=['minbase', 'python3'],
                   metavar='NAME', help='the two images to read '
                   '(default: minbase python3)')
    r.add_argument('--state', help='where the host config, host_dir and '
                   'chart go (default: the library state_dir)')
    r.add_argument('--socket', help='the NBD socket (default: '
                   'STATE/host/nbd.sock)')
    r.add_argument('--json', help='also write the figures here')
    s = sub.add_parser('stop', help='stop what an earlier run left')
    s.add_argument('--state', required=True)
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGHUP, _terminate)
    try:
        if args.command == 'stop':
            for line in stop_leftovers(args.state):
                print(line)
            return 0
        if os.geteuid() != 0:
            raise DemoError('needs root (to set the read-ahead)')
        return run(args)
    except DemoError as e:
        print('demo_host: error: %s' % e, file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:
        print('demo_host: interrupted (%s); vmar-export stopped'
              % (str(e) or 'Ctrl-C'), file=sys.stderr)
        return 130


if __name__ == '__main__':
    sys.exit(main())
