-- Leaf reads max_id as the next ID to hand out: an allocation raising it to M serves
-- [M - step, M). leafd writes M here too, so the next allocation knows M was left unserved and
-- starts there; a row whose max_id differs from this column was last allocated by Leaf or by an
-- older leafd (which served (M - step, M]), and the next range starts at M + 1 instead.
ALTER TABLE leaf_alloc ADD COLUMN exclusive_max BIGINT DEFAULT NULL;
