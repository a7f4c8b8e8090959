"""The package's imports keep the layers that design.rst states.

Every ``import`` of the package's own modules, at the top of a file or
inside a function, is read with :mod:`ast` and checked against the same
tables as the document's: a package imports only packages of lower layers,
the host side nothing of the library's SQL side, and inside ``host`` each
package only those below it.
"""

import ast
import os

import testtools

import vmar_openstack

TOP = os.path.dirname(os.path.abspath(vmar_openstack.__file__))

# layer of each top-level package or module (design.rst's table); a
# dotted key is a module that sits above its package (an entry point)
LAYERS = {
    'exception': 0,
    'names': 1, 'conf': 1, 'fileutils': 1, 'lru': 1, 'bus': 1,
    'periodic': 1, 'metrics': 1, 'glance_io': 1,
    'mapformat': 2,
    'fingerprint': 3, 'hostapi': 3, 'guest': 3,
    'db': 4, 'mapgen': 4, 'mapsource': 4,
    'ingest': 5, 'host': 5, 'nova_imagebackend': 5,
    'glance_hooks': 6, 'nova_api': 6, 'nova_scheduler': 6,
    'nova_wrappers': 7,
    'cmd': 8, 'nova_api.wsgi': 8,
}
# the library's SQL side, which a compute host never runs
LIBRARY = {'db', 'mapgen', 'ingest', 'glance_hooks'}
HOST_SIDE = {'host', 'mapsource', 'hostapi', 'guest', 'nova_imagebackend'}
# inside host: exports at the bottom, daemon alone at the top
HOST_LAYERS = {
    'exports': 1, 'peers': 2, 'cache': 2, 'guests': 2, 'observe': 3,
    'service': 4, 'supervisor': 4, 'api': 4, 'daemon': 5,
}


def _modules():
    """(dotted name below vmar_openstack, path) of every module."""
    for root, dirs, files in os.walk(TOP):
        dirs[:] = [d for d in dirs if d not in ('migration', '__pycache__')]
        for name in files:
            if name.endswith('.py'):
                path = os.path.join(root, name)
                rel = os.path.relpath(path, TOP)[:-3].replace(os.sep, '.')
                if rel.endswith('__init__'):
                    rel = rel[:-len('__init__')].rstrip('.')
                yield rel, path


def _imports(path):
    """Dotted names below vmar_openstack that the file imports."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith('vmar_openstack.'):
                    yield a.name[len('vmar_openstack.'):]
        elif isinstance(node, ast.ImportFrom) and node.module and (
                node.module == 'vmar_openstack' or
                node.module.startswith('vmar_openstack.')):
            base = node.module[len('vmar_openstack'):].lstrip('.')
            for a in node.names:
                yield '.'.join(filter(None, (base, a.name)))


def _layer(table, dotted):
    parts = dotted.split('.')
    for n in range(len(parts), 0, -1):
        if '.'.join(parts[:n]) in table:
            return '.'.join(parts[:n]), table['.'.join(parts[:n])]
    return None, None


class TestLayers(testtools.TestCase):

    def _check(self, src, dst, broken):
        if not src or not dst or src.split('.')[0] == dst.split('.')[0]:
            return
        (sname, slayer), (dname, dlayer) = (_layer(LAYERS, src),
                                            _layer(LAYERS, dst))
        if slayer is None or dlayer is None:
            broken.append('%s -> %s: a package design.rst does not place'
                          % (src, dst))
        elif dlayer >= slayer:
            broken.append('%s (layer %d) -> %s (layer %d)' % (
                src, slayer, dst, dlayer))
        elif (sname.split('.')[0] in HOST_SIDE and
              dname.split('.')[0] in LIBRARY):
            broken.append('%s -> %s: the host side imports the library'
                          % (src, dst))

    def test_every_import_goes_down_a_layer(self):
        broken = []
        for mod, path in _modules():
            for dst in _imports(path):
                self._check(mod, dst, broken)
        self.assertEqual([], broken)

    def test_host_packages_import_only_those_below(self):
        broken = []
        for mod, path in _modules():
            if not mod.startswith('host.'):
                continue
            src = mod.split('.')[1]
            for dst in _imports(path):
                if not dst.startswith('host.'):
                    continue
                part = dst.split('.')[1]
                if part == src:
                    continue
                if HOST_LAYERS.get(part, 99) >= HOST_LAYERS.get(src, 0):
                    broken.append('%s -> %s' % (mod, dst))
        self.assertEqual([], broken)

    def test_every_package_is_placed(self):
        tops = {mod.split('.')[0] for mod, _ in _modules() if mod}
        self.assertEqual(set(), tops - {k.split('.')[0] for k in LAYERS})
        hosts = {mod.split('.')[1] for mod, _ in _modules()
                 if mod.startswith('host.')}
        self.assertEqual(set(), hosts - set(HOST_LAYERS))
