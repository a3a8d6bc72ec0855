-- lake differs from source: [TableComparison(table='public.t', source=Digest(rows=28, checksum='8aa49d9be9de2581'), lake=Digest(rows=0, checksum='e3b0c44298fc1c14'))]
-- loaded
CREATE TYPE mood AS ENUM ('calm', 'busy');
CREATE DOMAIN amount AS numeric(12,2);
CREATE TYPE pair AS (a int, b text);
CREATE SCHEMA side;
SET search_path TO public, side;
ALTER PUBLICATION pgcdc SET (publish_via_partition_root = true);
CREATE TABLE "t" (k int, "c1" boolean, "c2" numeric(10,2), "c3" boolean);
ALTER TABLE "t" REPLICA IDENTITY FULL;
INSERT INTO "t" ("k", "c1", "c2", "c3") SELECT g % 3, (g) % 2 = 0, (g)::numeric / 4, (g) % 2 = 0 FROM generate_series(4000, 4013) g, generate_series(1, 2) n;
-- lake load
-- capture
-- apply
