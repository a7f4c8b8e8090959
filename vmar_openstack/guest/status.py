"""vmar-guest's status line, read on the host side.

After each pass vmar-guest (vmar-guest.c, ``write_status``) replaces its
status file with one line of ``key=value`` counters, cumulative since it
started, after its ``mode`` (``private`` or ``default``): ``passes
tracked events closes walks walked_files drops close_drops dropped_bytes
mincores syscalls table_full compactions switches``, two gauges,
``reporting_order`` (the guest kernel's page reporting order now) and
``mem_free_kb``, the guest's ``refaulted_bytes`` (file pages read again
soon after they were reclaimed, cumulative), and its CPU time,
``cpu_user_s cpu_sys_s``. The test
probe prints the same line on the console, and vmar-guest writes it into
the host's channel (:mod:`vmar_openstack.host.guests.channels`).
"""

PATH = '/run/vmar-guest.status'
COUNTERS = ('passes', 'tracked', 'events', 'closes', 'walks',
            'walked_files', 'drops', 'close_drops', 'dropped_bytes',
            'mincores', 'syscalls', 'table_full', 'compactions', 'switches',
            'refaulted_bytes', 'reporting_order', 'mem_free_kb', 'cpu_user_s',
            'cpu_sys_s')
MODES = ('private', 'default')


def parse(text):
    """{counter: float} of the ``key=value`` words in ``text``.

    Words that are not counters (a console line around the status) are
    ignored; a counter missing from ``text`` is 0, as before the first pass,
    and so is one whose value is not a number (a kernel message printed
    into the middle of a console line).
    """
    found = dict(w.split('=', 1) for w in text.split() if '=' in w)
    return {k: _number(found.get(k, 0)) for k in COUNTERS}


def mode(text):
    """The ``mode`` word of a status line: one of :data:`MODES`, or None."""
    for word in text.split():
        if word.startswith('mode=') and word[5:] in MODES:
            return word[5:]
    return None


def _number(value):
    """A counter's value; 0 if a console line garbled it."""
    try:
        return float(value)
    except ValueError:
        return 0.0


def read(path=PATH):
    """The counters in the status file; all 0 while there is none."""
    try:
        with open(path) as f:
            return parse(f.read())
    except FileNotFoundError:
        return parse('')


def cpu_seconds(counters):
    return counters['cpu_user_s'] + counters['cpu_sys_s']
