"""The cluster database: images, fingerprints and clusters in SQL.

This package owns every SQL statement of the project: the schema
(:mod:`.models`, migrated by alembic with its own version table
``vmar_alembic_version``), the engine and the library lock
(:mod:`.session`), the cluster tables behind one object,
:class:`.store.ClusterStore` (the operations of the VMAR paper, Fig. 4-7),
with its dialect-specific bulk statements (:mod:`.bulk`) and member sets
(:mod:`.members`), and the image queries other services make
(:mod:`.api`).
"""
