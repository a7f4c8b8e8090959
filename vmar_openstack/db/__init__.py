"""The cluster database: images, fingerprints and clusters in SQL.

This package owns the schema (:mod:`.models`, migrated by alembic with its
own version table ``vmar_alembic_version``), the engine and the library lock
(:mod:`.session`), the dialect-specific bulk key statements (:mod:`.bulk`),
and the cluster operations of the VMAR paper, Fig. 4-7 (:mod:`.api`).
"""
