-- A strict or period tag records its rule in `split` (`order:strict`,
-- `period:daily:6:Asia/Shanghai:ORD`: calendar, digits, time zone and prefix), so a node that
-- does not configure the tag serves it as recorded: 32 characters do not hold a time zone and
-- a prefix. Widening is additive: a release before this one reads and writes the column as
-- before. Repeatable (a change to the same type is a no-op).
ALTER TABLE leaf_alloc ALTER COLUMN split TYPE VARCHAR(255);
