"""qemu/series.py: the patch series tool's checks (no QEMU tree needed)."""

import importlib.util
import os
import pathlib
import shutil
import tempfile

import testtools

TOP = pathlib.Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location('series',
                                               TOP / 'qemu' / 'series.py')
series = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(series)


class TestSeries(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.tree = pathlib.Path(tempfile.mkdtemp())
        self.addCleanup(shutil.rmtree, self.tree)

    def patched_tree(self):
        """A tree holding what the series adds, as build.sh leaves it."""
        files = dict(series.VMAR_FILES, **series.MIRROR_FILES)
        files.update({'iotests/%s' % f: '%s/%s' % (series.IOTEST_DEST, f)
                      for f in series._iotests()})
        for src, dst in files.items():
            (self.tree / dst).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(series.HERE / src, self.tree / dst)
        (self.tree / 'block' / 'trace-events').write_text(
            '# other drivers\n\n' + series._trace_events('vmar.c') + '\n'
            + series._trace_events('vmar-mirror.c'))

    def test_a_tree_with_the_series_of_these_files_passes(self):
        self.patched_tree()
        self.assertEqual([], series.check(self.tree))

    def test_a_stale_driver_or_test_is_named(self):
        self.patched_tree()
        with open(self.tree / 'block' / 'vmar-mirror.c', 'a') as f:
            f.write('/* an older edit */\n')
        os.unlink(self.tree / series.IOTEST_DEST / 'tests' / 'vmar-read')
        self.assertEqual(
            ['block/vmar-mirror.c differs from qemu/block-vmar-mirror.c',
             'tests/qemu-iotests/tests/vmar-read differs from '
             'qemu/iotests/tests/vmar-read'],
            series.check(self.tree))

    def test_missing_trace_events_are_named(self):
        self.patched_tree()
        (self.tree / 'block' / 'trace-events').write_text('# none\n')
        self.assertEqual(
            ['block/trace-events lacks the events of vmar.c',
             'block/trace-events lacks the events of vmar-mirror.c'],
            series.check(self.tree))

    def test_an_edit_whose_place_is_not_there_once_stops(self):
        (self.tree / 'f.c').write_text('a\nb\na\n')
        e = self.assertRaises(series.SeriesError, series._edit, self.tree,
                              'f.c', r'^a$', 'x', 'the a line')
        self.assertIn('the a line is not there exactly once (2)', str(e))
        self.assertRaises(series.SeriesError, series._edit, self.tree,
                          'f.c', r'^c$', 'x', 'the c line')
        series._edit(self.tree, 'f.c', r'^b$', 'y', 'the b line')
        self.assertEqual('a\ny\na\n', (self.tree / 'f.c').read_text())

    def test_the_committed_series_carry_the_files_of_qemu(self):
        # every version's series adds the current drivers and tests
        for version in ('7.2', '10.0', '10.2'):
            patches = sorted((series.PATCHES / version).glob('*.patch'))
            self.assertEqual(4, len(patches), version)
            text = ''.join(p.read_text() for p in patches)
            for src in ('block-vmar.c', 'block-vmar-mirror.c',
                        'vmar-compat.h'):
                body = (series.HERE / src).read_text().splitlines()
                added = '\n'.join('+' + line for line in body)
                self.assertIn(added, text, '%s of %s' % (src, version))
