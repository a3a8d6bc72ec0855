-- pgcdc run exited 3 before the kill:
-- pgcdc: column c79 of public.part80: a value of composite type public.pair has attributes ['a', 'b', 'x125', 'x40', 'x98'], but the table version's Avro schema has ['a', 'b', 'x40'] (the type was altered while the table's version stayed); alter the table too (any column change gives it a new version and schema), or run with --avro-types text
-- encoding logical
CREATE TYPE mood AS ENUM ('calm', 'busy');
CREATE DOMAIN amount AS numeric(12,2);
CREATE TYPE pair AS (a int, b text);
CREATE SCHEMA side;
SET search_path TO public, side;
ALTER PUBLICATION pgcdc SET (publish_via_partition_root = true);
CREATE TABLE "t" (k int, "c1" date, "c2" bigint, "c3" timestamptz);
ALTER TABLE "t" REPLICA IDENTITY FULL;
INSERT INTO "t" ("k", "c1", "c2", "c3") SELECT g % 3, date '2000-01-01' + (g), (g)::bigint * 1000003, timestamptz '2000-01-01 00:00:00+00' + (g) * interval '61.5 seconds' FROM generate_series(4000, 4000) g, generate_series(1, 2) n;
BEGIN;
INSERT INTO "t" ("k", "c1", "c2", "c3") SELECT g % 3, date '2000-01-01' + (g), (g)::bigint * 1000003, timestamptz '2000-01-01 00:00:00+00' + (g) * interval '61.5 seconds' FROM generate_series(7000, 7001) g, generate_series(1, 1) n;
SAVEPOINT s;
ALTER TABLE "t" ADD COLUMN "c6" int DEFAULT 5;
INSERT INTO "t" ("k", "c1", "c2", "c3") SELECT g % 3, date '2000-01-01' + (g), (g)::bigint * 1000003, timestamptz '2000-01-01 00:00:00+00' + (g) * interval '61.5 seconds' FROM generate_series(10000, 10001) g, generate_series(1, 1) n;
UPDATE "t" SET "c6" = 6;
ROLLBACK TO SAVEPOINT s;
INSERT INTO "t" ("k", "c1", "c2", "c3") SELECT g % 3, date '2000-01-01' + (g), (g)::bigint * 1000003, timestamptz '2000-01-01 00:00:00+00' + (g) * interval '61.5 seconds' FROM generate_series(13000, 13001) g, generate_series(1, 1) n;
COMMIT;
ALTER TYPE mood ADD VALUE 'm16';
DROP TABLE "t";
CREATE TABLE "t" (id int CONSTRAINT "pk2" PRIMARY KEY, "c17" bigint, "c18" pair);
INSERT INTO "t" ("id", "c17", "c18") SELECT g, (g)::bigint * 1000003, ROW(g, 'p' || (g))::pair FROM generate_series(19000, 19004) g, generate_series(1, 1) n;
CREATE TABLE "u" (id int, r int, "c25" boolean, CONSTRAINT "pk3" PRIMARY KEY (id, r)) PARTITION BY RANGE (r);
CREATE TABLE "part26" PARTITION OF "u" FOR VALUES FROM (0) TO (10);
CREATE TABLE "part27" PARTITION OF "u" FOR VALUES FROM (10) TO (20);
INSERT INTO "u" ("id", "r", "c25") SELECT g, (ARRAY[0, 1])[1 + abs(g) % 2] * 10 + abs(g) % 10, (g) % 2 = 0 FROM generate_series(28000, 28000) g, generate_series(1, 1) n;
ALTER TABLE "t" RENAME COLUMN "c17" TO "c30";
INSERT INTO "t" ("id", "c18", "c30") SELECT g, ROW(g, 'p' || (g))::pair, (g)::bigint * 1000003 FROM generate_series(31000, 31002) g, generate_series(1, 1) n;
-- capture
DROP TABLE "t";
ALTER TABLE "u" ADD COLUMN "c35" bigint DEFAULT (random() * 1e9)::bigint;
INSERT INTO "u" ("id", "r", "c25", "c35") SELECT g, (ARRAY[0, 1])[1 + abs(g) % 2] * 10 + abs(g) % 10, (g) % 2 = 0, (g)::bigint * 1000003 FROM generate_series(36000, 36002) g, generate_series(1, 1) n;
ALTER TYPE pair ADD ATTRIBUTE x40 int;
ALTER PUBLICATION pgcdc SET (publish_via_partition_root = false);
CREATE TABLE "we""ird;name" (id int, r int, "c41" mood, "c42" text, "c43" amount, CONSTRAINT "pk4" PRIMARY KEY (id, r)) PARTITION BY RANGE (r);
CREATE TABLE "part44" PARTITION OF "we""ird;name" FOR VALUES FROM (0) TO (10);
CREATE TABLE "part45" PARTITION OF "we""ird;name" FOR VALUES FROM (10) TO (20);
INSERT INTO "we""ird;name" ("id", "r", "c41", "c42", "c43") SELECT g, (ARRAY[0, 1])[1 + abs(g) % 2] * 10 + abs(g) % 10, (enum_range(NULL::mood))[1 + abs(g) % cardinality(enum_range(NULL::mood))], 't' || (g), (g)::numeric / 8 FROM generate_series(46000, 46018) g, generate_series(1, 1) n;
-- capture
BEGIN;
INSERT INTO "we""ird;name" ("id", "r", "c41", "c42", "c43") SELECT g, (ARRAY[0, 1])[1 + abs(g) % 2] * 10 + abs(g) % 10, (enum_range(NULL::mood))[1 + abs(g) % cardinality(enum_range(NULL::mood))], 't' || (g), (g)::numeric / 8 FROM generate_series(67000, 67002) g, generate_series(1, 1) n;
SAVEPOINT s;
ALTER TABLE "we""ird;name" ADD COLUMN "c66" int DEFAULT 5;
INSERT INTO "we""ird;name" ("id", "r", "c41", "c42", "c43") SELECT g, (ARRAY[0, 1])[1 + abs(g) % 2] * 10 + abs(g) % 10, (enum_range(NULL::mood))[1 + abs(g) % cardinality(enum_range(NULL::mood))], 't' || (g), (g)::numeric / 8 FROM generate_series(71000, 71002) g, generate_series(1, 1) n;
UPDATE "we""ird;name" SET "c66" = 6;
ROLLBACK TO SAVEPOINT s;
INSERT INTO "we""ird;name" ("id", "r", "c41", "c42", "c43") SELECT g, (ARRAY[0, 1])[1 + abs(g) % 2] * 10 + abs(g) % 10, (enum_range(NULL::mood))[1 + abs(g) % cardinality(enum_range(NULL::mood))], 't' || (g), (g)::numeric / 8 FROM generate_series(75000, 75002) g, generate_series(1, 1) n;
COMMIT;
-- capture
CREATE TABLE "t" (id int, r int, "c79" pair, CONSTRAINT "pk5" PRIMARY KEY (id, r)) PARTITION BY RANGE (r);
CREATE TABLE "part80" PARTITION OF "t" FOR VALUES FROM (0) TO (10);
CREATE TABLE "part81" PARTITION OF "t" FOR VALUES FROM (10) TO (20);
INSERT INTO "t" ("id", "r", "c79") SELECT g, (ARRAY[0, 1])[1 + abs(g) % 2] * 10 + abs(g) % 10, ROW(g, 'p' || (g), NULL)::pair FROM generate_series(82000, 82010) g, generate_series(1, 1) n;
TRUNCATE "part81";
INSERT INTO "t" ("id", "r", "c79") SELECT g, (ARRAY[0, 1])[1 + abs(g) % 2] * 10 + abs(g) % 10, ROW(g, 'p' || (g), NULL)::pair FROM generate_series(94000, 94001) g, generate_series(1, 1) n;
UPDATE "t" SET "c79" = ROW(id + 97, 'p' || (id + 97), NULL)::pair WHERE "id" % 3 = 2;
ALTER TYPE pair ADD ATTRIBUTE x98 int;
INSERT INTO "t" ("id", "r", "c79") SELECT g, (ARRAY[0, 1])[1 + abs(g) % 2] * 10 + abs(g) % 10, ROW(g, 'p' || (g), NULL, NULL)::pair FROM generate_series(99000, 99001) g, generate_series(1, 1) n;
ALTER TYPE mood RENAME VALUE 'm16' TO 'm102';
BEGIN;
INSERT INTO "we""ird;name" ("id", "r", "c41", "c42", "c43") SELECT g, (ARRAY[0, 1])[1 + abs(g) % 2] * 10 + abs(g) % 10, (enum_range(NULL::mood))[1 + abs(g) % cardinality(enum_range(NULL::mood))], 't' || (g), (g)::numeric / 8 FROM generate_series(104000, 104004) g, generate_series(1, 1) n;
SAVEPOINT s;
ALTER TABLE "we""ird;name" ADD COLUMN "c103" int DEFAULT 5;
INSERT INTO "we""ird;name" ("id", "r", "c41", "c42", "c43") SELECT g, (ARRAY[0, 1])[1 + abs(g) % 2] * 10 + abs(g) % 10, (enum_range(NULL::mood))[1 + abs(g) % cardinality(enum_range(NULL::mood))], 't' || (g), (g)::numeric / 8 FROM generate_series(110000, 110004) g, generate_series(1, 1) n;
UPDATE "we""ird;name" SET "c103" = 6;
ROLLBACK TO SAVEPOINT s;
INSERT INTO "we""ird;name" ("id", "r", "c41", "c42", "c43") SELECT g, (ARRAY[0, 1])[1 + abs(g) % 2] * 10 + abs(g) % 10, (enum_range(NULL::mood))[1 + abs(g) % cardinality(enum_range(NULL::mood))], 't' || (g), (g)::numeric / 8 FROM generate_series(116000, 116004) g, generate_series(1, 1) n;
COMMIT;
ALTER TYPE mood ADD VALUE 'm122';
UPDATE "we""ird;name" SET "c41" = 'm122' WHERE "id" % 3 = 2;
UPDATE "t" SET id = -id, r = (ARRAY[0, 1])[1 + abs(id + 123) % 2] * 10 + abs(id + 123) % 10 WHERE id % 3 = 2 AND id > 0;
ALTER TYPE mood ADD VALUE 'm124';
UPDATE "we""ird;name" SET "c41" = 'm124' WHERE "id" % 3 = 1;
ALTER TYPE pair ADD ATTRIBUTE x125 int;
INSERT INTO "t" ("id", "r", "c79") SELECT g, (ARRAY[0, 1])[1 + abs(g) % 2] * 10 + abs(g) % 10, ROW(g, 'p' || (g), NULL, NULL, NULL)::pair FROM generate_series(126000, 126001) g, generate_series(1, 1) n;
-- capture
