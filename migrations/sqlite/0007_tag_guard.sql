-- A row every tag creation updates first: creations on all nodes (and all Galera members) are
-- serialized on it, so counting the tags and inserting one cannot race past segment.max_tags.
CREATE TABLE leafd_guard (
    name    VARCHAR(64) NOT NULL PRIMARY KEY,
    counter BIGINT      NOT NULL DEFAULT 0
);
INSERT INTO leafd_guard (name, counter) VALUES ('tags', 0);
