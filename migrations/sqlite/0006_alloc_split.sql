-- The residue class a tag hands out (`<id_delta>:<id_remainder>`, segment.id_delta and
-- segment.id_remainder), recorded like the opaque key: a node whose class is not inside the
-- recorded one is refused, so a changed data-centre split cannot reach IDs another cluster
-- served. NULL: the whole space, never split.
ALTER TABLE leaf_alloc ADD COLUMN split VARCHAR(32) DEFAULT NULL;
