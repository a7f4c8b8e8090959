"""Where a base's bytes come from: typed descriptions, not QEMU options.

A map source that can fill mirrors answers ``base_reader(image_id,
size)`` with one of these. The host keeps it with the mirror (its
``.reader`` file, :func:`to_record`), so a restarted daemon rebuilds the
mirror's fetch node without asking the source; only
:mod:`vmar_openstack.host.exports.graph` turns a description into
``blockdev-add`` options.

* :class:`File`: a file on the host (a library directory, NFS);
* :class:`RangeExport`: an export of the host's range server (nbdkit,
  :mod:`.nbdkit_glance`): a Glance image's stored bytes, read through
  Glance's data API or straight from Glance's RBD pool;
* :class:`Qcow2`: QEMU's qcow2 driver over one of those (a qcow2 image in
  the store, its header inspected first).
"""

import dataclasses

from vmar_openstack import exception


@dataclasses.dataclass(frozen=True)
class File:
    path: str

    kind = 'file'


@dataclasses.dataclass(frozen=True)
class RangeExport:
    socket: str
    export: str

    kind = 'range-export'


@dataclasses.dataclass(frozen=True)
class Qcow2:
    file: object        # File or RangeExport

    kind = 'qcow2'


_KINDS = {c.kind: c for c in (File, RangeExport, Qcow2)}


def to_record(reader):
    """The JSON-ready record of a description."""
    out = {'kind': reader.kind}
    for f in dataclasses.fields(reader):
        value = getattr(reader, f.name)
        out[f.name] = (to_record(value) if dataclasses.is_dataclass(value)
                       else value)
    return out


def from_record(record):
    """The description a record holds.

    Records of releases before typed descriptions were QEMU options (a
    ``file``, ``nbd`` or ``qcow2`` node): they are read as what they
    describe.

    :raises ExportError: not a description this release knows.
    """
    try:
        if 'kind' not in record:
            return _from_options(record)
        cls = _KINDS[record['kind']]
        values = {f.name: record[f.name] for f in dataclasses.fields(cls)}
        if cls is Qcow2:
            values['file'] = from_record(values['file'])
            if isinstance(values['file'], Qcow2):
                raise ValueError('qcow2 over qcow2')
        elif not all(isinstance(v, str) and v for v in values.values()):
            raise ValueError('empty or not a string')
        return cls(**values)
    except (KeyError, TypeError, ValueError) as e:
        raise exception.ExportError('not a base reader: %r (%s)'
                                    % (record, e))


def _from_options(node):
    """A description from the ``blockdev-add`` options of earlier releases."""
    driver = node['driver']
    if driver == 'file':
        return File(node['filename'])
    if driver == 'nbd':
        return RangeExport(node['server']['path'], node['export'])
    if driver == 'qcow2':
        return Qcow2(_from_options(node['file']))
    raise ValueError('driver %r' % driver)
