"""What every JSON file of an image's (boot set, block layout) begins with.

Each is one object with ``format``, ``version``, ``image_id``,
``virtual_size`` and ``block_size``; :func:`parse` checks them, the
format's module the rest.
"""

import json
import uuid


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
