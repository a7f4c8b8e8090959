"""Console scripts, and the runner and table printer they share."""

import sys

from oslo_config import cfg
from oslo_log import log as logging

from vmar_openstack import exception


def run(conf, name, add_command_parsers, errors=(), argv=None):
    """Parse ``argv`` into ``conf``, run the chosen sub-command.

    A :class:`~vmar_openstack.exception.VmarException`, or an exception of
    a class in ``errors``, becomes one line on stderr and exit status 1;
    no sub-command prints the help and returns 2.
    """
    conf.register_cli_opt(cfg.SubCommandOpt(
        'category', title='commands', handler=add_command_parsers))
    logging.register_options(conf)
    conf(sys.argv[1:] if argv is None else argv, project='vmar')
    logging.setup(conf, 'vmar')
    func = getattr(conf.category, 'func', None)
    if func is None:
        conf.print_help()
        return 2
    try:
        func()
    except (exception.VmarException,) + tuple(errors) as e:
        print('%s: error: %s' % (name, e), file=sys.stderr)
        return 1
    return 0


def print_table(header, rows):
    """Columns padded to their widest cell, two spaces apart."""
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    for r in [header] + list(rows):
        print('  '.join(str(x).ljust(w)
                        for x, w in zip(r, widths)).rstrip())
