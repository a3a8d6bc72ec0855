# A stand-in for postgres:16 built from a local Debian bookworm base: Debian's PostgreSQL (15),
# initialized on first start as the public image does (POSTGRES_PASSWORD for the postgres
# superuser, password logins from the network, replication included), then `postgres "$@"`.
ARG BASE_IMAGE=localhost/pgcdc-base:bookworm
FROM ${BASE_IMAGE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends postgresql \
 && rm -rf /var/lib/apt/lists/* \
 && pg_dropcluster 15 main
ENV PATH=/usr/lib/postgresql/15/bin:$PATH PGDATA=/var/lib/postgresql/data
COPY docker/local/postgres-entrypoint.sh /usr/local/bin/postgres-entrypoint.sh
ENTRYPOINT ["/usr/local/bin/postgres-entrypoint.sh"]
CMD ["postgres"]
EXPOSE 5432
