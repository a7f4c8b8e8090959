"""The wire format of the host API, version 1.

One connection carries any number of requests, one at a time. Each
message is one JSON object on one line (UTF-8, ``\\n``-terminated, at
most :data:`MAX_LINE` bytes)::

    request   {"api": 1, "op": "add", "args": {...}}
    reply     {"api": 1, "result": ...}
           or {"api": 1, "error": {"type": "ExportError", "message": ...}}

``api`` is the version the client speaks. A daemon answers a version it
does not speak with an ``UnsupportedVersion`` error that lists the ones it
does (``hello`` tells them too), so a client can fall back; within a
version, operations only gain optional arguments and replies only gain
keys.

Operations of version 1 (:data:`OPS`; doc/source/reference/design.rst has their
arguments and replies):

``hello``
    versions spoken, the daemon's pid, the NBD socket, the directory of
    the guests' channels (None while they are off).
``add``
    export a map version of an image for a holder (a reference); returns
    once the export is served, with its NBD URI.
``remove``
    drop a holder's reference on an image's exports.
``release``
    drop every reference of a holder.
``holders``
    holder -> names of the exports it holds.
``list``
    the export records, each with its state (up, missing, down).
``status``
    bases, exports and their counters (``vmar-export status --json``).
``digests``
    the path on the host of an image's digest list (one SHA-256 per
    block, ``doc/source/reference/mirror-format.rst``), fetched if the host
    lacks it, for a map version the host holds: what a snapshot's delta is
    compared against.
``health``
    whether qemu-storage-daemon answers, and which of the NBD names
    asked about it serves now: what the resumer of paused guests waits
    on. NBD names carry their holders' keys, so no reply lists names the
    caller did not give.
"""

import json

from vmar_openstack import exception

VERSION = 1
VERSIONS = (1,)
MAX_LINE = 1 << 20

OPS = ('hello', 'add', 'remove', 'release', 'holders', 'list', 'status',
       'health', 'digests')

# the errors a reply may carry, by name: the client raises the same class
ERRORS = {cls.__name__: cls for cls in (
    exception.ExportError, exception.ExportDaemonDown,
    exception.HostApiError, exception.HostApiDenied,
    exception.UnsupportedVersion)}


def encode(obj):
    """One message: compact JSON and a newline."""
    data = json.dumps(obj, separators=(',', ':'), sort_keys=True).encode()
    if len(data) >= MAX_LINE:
        raise exception.HostApiError(reason='message of %d bytes is over '
                                     'the limit' % len(data))
    return data + b'\n'


def decode(line):
    """The JSON object of one message line.

    :raises HostApiError: not a JSON object, or too long.
    """
    if len(line) > MAX_LINE or not line.endswith(b'\n'):
        raise exception.HostApiError(reason='message too long or cut off')
    try:
        obj = json.loads(line)
    except ValueError as e:
        raise exception.HostApiError(reason='not JSON: %s' % e)
    if not isinstance(obj, dict):
        raise exception.HostApiError(reason='a message is a JSON object')
    return obj


def request(op, args):
    return {'api': VERSION, 'op': op, 'args': args}


def reply(result):
    return {'api': VERSION, 'result': result}


def error_reply(exc):
    """The reply of an exception the daemon raised on purpose."""
    name = type(exc).__name__
    if name not in ERRORS:
        name = 'ExportError'
    return {'api': VERSION, 'error': {'type': name, 'message': str(exc)}}


def raise_error(err):
    """Raise the exception an error reply carries."""
    if not isinstance(err, dict):
        raise exception.HostApiError(reason='malformed error %r' % (err,))
    cls = ERRORS.get(err.get('type'), exception.ExportError)
    raise cls(str(err.get('message', 'no message')))
