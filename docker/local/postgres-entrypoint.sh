#!/bin/sh
# The public postgres image's start, reduced to what docker/compose.yml uses: initialize $PGDATA
# once with POSTGRES_PASSWORD for the postgres superuser, then run the command as postgres.
set -eu
mkdir -p "$PGDATA" /var/run/postgresql
chown postgres:postgres "$PGDATA" /var/run/postgresql
chmod 700 "$PGDATA"
as_postgres() { setpriv --reuid=postgres --regid=postgres --init-groups "$@"; }
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    : "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD must be set (the postgres superuser's password)}"
    printf '%s\n' "$POSTGRES_PASSWORD" > /tmp/pwfile
    chown postgres /tmp/pwfile
    as_postgres initdb --username=postgres --pwfile=/tmp/pwfile --auth-local=trust \
        --auth-host=scram-sha-256 --encoding=UTF8 --locale=C.UTF-8 >/dev/null
    rm -f /tmp/pwfile
    printf '%s\n' "host all all all scram-sha-256" "host replication all all scram-sha-256" \
        >> "$PGDATA/pg_hba.conf"
    printf '%s\n' "listen_addresses = '*'" >> "$PGDATA/postgresql.conf"
fi
if [ "${1:-}" = postgres ]; then
    exec setpriv --reuid=postgres --regid=postgres --init-groups "$@"
fi
exec "$@"
