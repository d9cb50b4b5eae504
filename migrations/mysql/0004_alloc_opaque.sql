-- The key under which a tag hands out opaque IDs (`d<digits>:<fingerprint>`, never the key):
-- recorded by the first node that serves them, so a node with another key, or one serving the
-- tag's plain IDs below the opaque ones, is refused instead of repeating an ID.
ALTER TABLE leaf_alloc ADD COLUMN opaque VARCHAR(64) DEFAULT NULL;
