"""``[vmar_database]``: the cluster database (the library's)."""

from oslo_config import cfg

GROUP = cfg.OptGroup(
    'vmar_database', title='VMAR cluster database',
    help='Where the VMAR cluster tables live.')

database_opts = [
    cfg.StrOpt('connection', secret=True,
               default='sqlite:///$vmar.state_dir/vmar.sqlite',
               help='SQLAlchemy URL of the cluster database, for example '
                    'sqlite:////var/lib/vmar/vmar.sqlite, '
                    'mysql+pymysql://vmar:secret@db/vmar or '
                    'postgresql+psycopg2://vmar:secret@db/vmar.'),
    cfg.IntOpt('lock_timeout', default=600, min=1,
               help='Seconds a mutation waits for the library lock held by '
                    'another ingest before it fails.'),
    cfg.BoolOpt('connection_debug', default=False,
                help='Log every SQL statement.'),
]

ALL_OPTS = database_opts
