-- MariaDB and PostgreSQL widen `split` to 255 characters here (a strict or period tag's rule
-- with its time zone and prefix). SQLite does not enforce a VARCHAR's length: nothing to do,
-- but the version keeps the three dialects' histories alike.
SELECT 1;
