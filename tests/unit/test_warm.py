"""The metadata a host keeps warm: planned through maps, locked for real.

A host directory with two images: B shares its first blocks with A
(its map reads them from A's base) and holds the rest itself. Their
layouts name superblocks, directories and a journal. The daemon's warm
set must be the canonical blocks of the metadata (not the journal), the
most shared first within the budget, only present blocks of a mirror,
and really locked: the kernel says so in ``/proc/self/smaps``.
"""

import os

import fixtures
import numpy as np
import testtools

from vmar_openstack import fileutils
from vmar_openstack.host.cache import warm
from vmar_openstack.host.exports import hostdir
from vmar_openstack.host.exports import state as export_state
from vmar_openstack import mapformat
from vmar_openstack.mapformat import layout
from vmar_openstack.mapformat import mirror as mirror_format
from vmar_openstack.mapsource import local
from vmar_openstack import names

A = '00000000-0000-4000-8000-00000000000a'
B = '00000000-0000-4000-8000-00000000000b'
C = '00000000-0000-4000-8000-00000000000c'
BS = 4096
N = 16


def _runs(kinds):
    """Layout runs of a list of per-block kinds."""
    codes = [layout.CODE[k] for k in kinds]
    return layout.from_arrays(A, N * BS, BS, (), (), codes, [-1] * N).runs


class TestWarm(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.root = self.useFixture(fixtures.TempDir()).path
        self.files = hostdir.HostDir(self.root, None)
        self.conf = self.useFixture(fixtures.MockPatchObject(
            warm, 'LOG')).mock
        os.makedirs(os.path.join(self.root, 'bases'))
        for image in (A, B):
            with open(os.path.join(self.root, 'bases', image), 'wb') as f:
                f.write(os.urandom(N * BS))
        # A: its own blocks 0-11 (12-15 zero)
        self.map(A, [mapformat.Target(A, N * BS, True)],
                 [(0, 12, 0, 0)])
        # B: blocks 0-7 are A's, 8-15 its own
        self.map(B, [mapformat.Target(A, N * BS),
                     mapformat.Target(B, N * BS, True)],
                 [(0, 8, 0, 0), (8, 8, 8, 1)])
        meta = ['superblock', 'directory', 'journal', 'journal']
        self.layout(A, meta + ['data'] * 8 + ['free'] * 4)
        self.layout(B, meta + ['data'] * 4 + ['directory', 'inode-table']
                    + ['data'] * 6)

    def map(self, image, targets, extents):
        ext = np.array(extents, dtype=mapformat.EXTENT_DTYPE)
        path = self.files.map_file(image, 1)
        fileutils.write_atomic(path, mapformat.encode(
            image, N * BS, BS, 1, targets, ext))

    def layout(self, image, kinds):
        lay = layout.Layout(image, N * BS, BS, (), (), _runs(kinds))
        fileutils.write_atomic(self.files.layout_file(image),
                               layout.encode(lay))

    def exports(self, *records):
        with export_state.State(self.root) as state:
            for image, cache in records:
                state.exports[names.export(image, 1)] = export_state.Export(
                    image, 1, cache, ['h'], [])
            state.save()
        return list(state.exports.values())

    def test_plan_takes_canonical_metadata_most_shared_first(self):
        exports = self.exports((A, 'base'), (B, 'base'), (C, 'base'))
        ranges, wanted, missing = warm.plan(self.files, exports, 1 << 20)
        # A's superblock and directory (blocks 0-1) are B's too; B's own
        # directory and inode table are its blocks 8-9; journals never
        self.assertEqual({A: [(0, 2 * BS)], B: [(8 * BS, 2 * BS)]}, ranges)
        self.assertEqual(4 * BS, wanted)
        self.assertEqual([C], missing)
        # a budget of three blocks: the shared two first, then one more
        ranges, _w, _m = warm.plan(self.files, exports, 3 * BS)
        self.assertEqual({A: [(0, 2 * BS)], B: [(8 * BS, BS)]}, ranges)
        ranges, _w, _m = warm.plan(self.files, exports, BS - 1)
        self.assertEqual({}, ranges)

    def test_uncached_exports_are_left_out(self):
        exports = self.exports((A, 'none'), (B, 'none'))
        self.assertEqual(({}, 0, []), warm.plan(self.files, exports, 1 << 20))

    def conf_fixture(self, mb):
        class C:
            class vmar_host:
                warm_metadata_mb = mb
                warm_interval = 3600
        return C

    def locked_kb(self):
        """``{path: Locked kB}`` of this process's mappings of base files."""
        out, path = {}, None
        with open('/proc/self/smaps') as f:
            for line in f:
                fields = line.split()
                if '-' in fields[0] and len(fields) >= 6:
                    path = fields[5]
                elif fields[0] == 'Locked:' and path and \
                        path.startswith(self.root):
                    out[path] = out.get(path, 0) + int(fields[1])
        return out

    def test_step_locks_the_plan_and_lets_go(self):
        self.exports((A, 'base'), (B, 'base'))
        w = warm.Warm(self.conf_fixture(1), self.files, self.root)
        self.addCleanup(w.stop)
        w.step()
        st = w.snapshot()
        self.assertEqual((4 * BS, 4 * BS, 2, ''), (st.locked_bytes,
                                                   st.wanted_bytes,
                                                   st.ranges, st.error))
        self.assertEqual({A: 2 * BS, B: 2 * BS}, st.bases)
        locked = self.locked_kb()
        self.assertEqual({self.files.base_file(A): 8,
                          self.files.base_file(B): 8}, locked)
        # B's export goes: only A's own metadata stays, unshared now
        with export_state.State(self.root) as state:
            del state.exports[names.export(B, 1)]
            state.save()
        w.step()
        self.assertEqual({self.files.base_file(A): 8}, self.locked_kb())
        w.stop()
        self.assertEqual({}, self.locked_kb())

    def test_a_mirror_locks_only_what_it_holds(self):
        self.exports((B, 'base'))
        # B's own base is a mirror that holds block 9, not block 8
        os.unlink(os.path.join(self.root, 'bases', B))
        m = self.files.mirror(B)
        os.makedirs(os.path.dirname(m.data))
        with open(m.data, 'wb') as f:
            f.truncate(N * BS)
        hdr = mirror_format.Header(B, N * BS, BS)
        mirror_format.create_present(m.present, hdr)
        with open(m.present, 'r+b') as f:
            f.seek(mirror_format.PRESENT_HEADER_SIZE + 1)
            f.write(b'\x02')        # block 9
        w = warm.Warm(self.conf_fixture(1), self.files, self.root)
        self.addCleanup(w.stop)
        w.step()
        self.assertEqual({A: 2 * BS, B: BS}, w.snapshot().bases)
        self.assertEqual(4, self.locked_kb()[m.data])

    def test_a_layout_the_host_lacks_is_fetched_then_locked(self):
        # B's layout is only in the library (exports restored after an
        # upgrade have none on the host)
        lib = self.useFixture(fixtures.TempDir()).path
        os.makedirs(os.path.join(lib, 'digests'))
        os.rename(self.files.layout_file(B),
                  os.path.join(lib, 'digests', names.layout_file(B)))
        files = hostdir.HostDir(self.root, local.LocalDirSource(lib))
        self.exports((A, 'base'), (B, 'base'))
        w = warm.Warm(self.conf_fixture(1), files, self.root)
        self.addCleanup(w.stop)
        w.step()
        st = w.snapshot()
        self.assertEqual([], st.without_layout)
        self.assertEqual({A: 2 * BS, B: 2 * BS}, st.bases)
        self.assertIsNotNone(files.layout(B))
        # one the source has not either is asked for again only later
        self.exports((C, 'base'))
        w.step()
        self.assertEqual([C], w.snapshot().without_layout)
        asked = w.asked[C]
        w.step()
        self.assertEqual(asked, w.asked[C])
        w._fetch_layouts(self.exports(), now=asked + warm.LAYOUT_RETRY)
        self.assertEqual(asked + warm.LAYOUT_RETRY, w.asked[C])

    def test_budget_zero_runs_nothing(self):
        self.assertIsNone(warm.start(self.conf_fixture(0), self.files,
                                     self.root))
