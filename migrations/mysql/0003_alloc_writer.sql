-- Which database instance made each tag's last allocation (a value bound by leafd, never a
-- function a replica would re-evaluate): an allocation that finds another instance's mark
-- knows the database failed over or was restored, and moves past what it may have lost.
ALTER TABLE leaf_alloc ADD COLUMN writer VARCHAR(128) DEFAULT NULL;
