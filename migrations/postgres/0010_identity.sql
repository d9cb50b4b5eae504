-- One row naming this database (slot 1): its id is kept by a backup, a restore and a failover
-- and is new in a new database, so a node's segment marks, kept per id, guard the database
-- they came from and no other. `origin` is `new` when the row was made together with the
-- schema, `upgrade` when it was added to a schema that may have served IDs before: marks
-- recorded before ids were kept apply to the latter. The row itself is written by leafd after
-- the migrations (with a random id). Additive: a release before it ignores the table.
CREATE TABLE leafd_identity (
    slot   INT         NOT NULL PRIMARY KEY,
    id     VARCHAR(64) NOT NULL,
    origin VARCHAR(16) NOT NULL
);
