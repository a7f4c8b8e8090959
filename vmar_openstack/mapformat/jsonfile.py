"""What every JSON file of an image's (boot set, block layout) begins with.

Each is one object with ``format``, ``version``, ``image_id``,
``virtual_size`` and ``block_size``; :func:`parse` checks them, the
format's module the rest.
"""

import json
import re
import uuid


def _head(fmt, version, image_id, size):
    """How :func:`dump` begins the file of these header fields."""
    return dump({'format': fmt, 'version': version, 'image_id': image_id,
                 'virtual_size': size})[:-1] + b','


def renamed_same_size(data, parent_id, image_id, fmt, version, max_size,
                      error):
    """A parent's file as ``image_id``'s of the same size, or None.

    Only the header is rewritten, when the file begins as :func:`dump`
    begins it (all the formats' ``encode`` do): the rest was checked when
    the parent's file was written. None: parse it (:func:`renamed`).
    """
    if len(data) > max_size:
        raise error(parent_id, 'larger than %d bytes' % max_size)
    m = re.match(rb'\{"format":"[^"]*","version":\d+,"image_id":"[^"]*",'
                 rb'"virtual_size":(\d+),', data)
    if m is None:
        return None
    size = int(m.group(1))
    if m.group(0) != _head(fmt, version, parent_id, size):
        return None
    return _head(fmt, version, image_id, size) + data[m.end():], size


def renamed(data, parent_id, image_id, size, fmt, version, max_size,
            error):
    """``(object, old size, block size)`` of a parent's file, renamed.

    The object (parsed as :func:`parse` does) names ``image_id`` and
    ``size``: the start of the same file of an image made from the parent
    (a snapshot), for the format to adjust and :func:`dump`.
    """
    raw, old, bs = parse(data, parent_id, fmt, version, max_size, error)
    raw.update(image_id=image_id, virtual_size=size)
    return raw, old, bs


def dump(raw):
    return json.dumps(raw, separators=(',', ':')).encode()


def parse(data, image_id, fmt, version, max_size, error):
    """``(object, virtual size, block size)`` of the file's bytes ``data``.

    ``error(image_id, detail)`` makes the format's exception; it is raised
    for a file too large, not JSON, of another format or version, of
    another image, or of an impossible size or block size.
    """
    if len(data) > max_size:
        raise error(image_id, 'larger than %d bytes' % max_size)
    try:
        raw = json.loads(data)
        ok = raw['format'] == fmt and raw['version'] == version
        got = str(uuid.UUID(raw['image_id'])) if ok else None
        size, bs = int(raw['virtual_size']), int(raw['block_size'])
    except (ValueError, KeyError, TypeError) as e:
        raise error(image_id, 'malformed: %s' % e)
    if not ok:
        raise error(image_id, 'not a %s file of version %d' % (fmt, version))
    if got != image_id:
        raise error(image_id, 'describes image %s' % got)
    if size <= 0 or bs < 512 or bs & (bs - 1):
        raise error(image_id, 'virtual size %d, block size %d' % (size, bs))
    return raw, size, bs
