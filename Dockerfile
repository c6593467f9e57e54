# syntax=docker/dockerfile:1
# The knobtune service (REST API, dashboard, scheduler) with pgbench.
# On Debian, pgbench ships in the server package (postgresql-15); having initdb
# too means "sandbox" targets also work inside the container.
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN set -eux; \
    apt-get update; \
    apt-get install -y --no-install-recommends postgresql-common; \
    # No cluster in the image: targets live elsewhere or are sandboxes made at runtime.
    sed -ri 's/^#?\s*create_main_cluster\s*=.*$/create_main_cluster = false/' \
        /etc/postgresql-common/createcluster.conf; \
    apt-get install -y --no-install-recommends postgresql-15 postgresql-client-15; \
    rm -rf /var/lib/apt/lists/*
ENV PATH=/usr/lib/postgresql/15/bin:$PATH

WORKDIR /src
COPY pyproject.toml README.md ./
COPY app ./app
COPY optimizer ./optimizer
COPY migrations ./migrations
RUN pip install . && rm -rf /src

# Restart path of the compose target (see docker-compose.yml): ask the server,
# as its superuser, to fast-shut itself down; the target's supervisor loop
# starts it again; return once pg_postmaster_start_time() has changed.
# The DSN comes from the environment (KNOBTUNE_RESTART_DSN, passed to this command
# alone by its restart method's "env"); the API only ever names the method.
COPY --chmod=0755 <<'EOF' /usr/local/bin/knobtune-restart-target
#!/bin/sh
set -eu
dsn="${KNOBTUNE_RESTART_DSN:?set KNOBTUNE_RESTART_DSN to the target superuser DSN}"
before=$(psql "$dsn" -XAtqc "SELECT pg_postmaster_start_time()")
# Zero rows: the program's stdin is never written, so its early exit is no error.
# The 1 s delay lets this COPY return before the server goes down.
psql "$dsn" -Xq -v ON_ERROR_STOP=1 <<'SQL'
DO $do$
BEGIN
  EXECUTE format(
    'COPY (SELECT 1 WHERE false) TO PROGRAM %L',
    format('(sleep 1; kill -INT "$(head -n 1 %s/postmaster.pid)") </dev/null >/dev/null 2>&1 &',
           current_setting('data_directory')));
END
$do$;
SQL
i=0
while [ "$i" -lt 240 ]; do
  sleep 0.5
  now=$(psql "$dsn" -XAtqc "SELECT pg_postmaster_start_time()" 2>/dev/null || true)
  if [ -n "$now" ] && [ "$now" != "$before" ]; then
    exit 0
  fi
  i=$((i + 1))
done
echo "the target did not come back within 120 s" >&2
exit 1
EOF

# The service never runs as root in the image: it has nothing to drop, and everything it
# starts (pgbench, the restart command) runs as this user too.
RUN useradd --system --uid 10001 --create-home --home-dir /var/lib/knobtune knobtune
USER knobtune
WORKDIR /var/lib/knobtune
ENV KNOBTUNE_WORK_DIR=/var/lib/knobtune/work

EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=5s --start-period=20s --retries=3 \
    CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4)"
CMD ["knobtune", "serve", "--host", "0.0.0.0", "--port", "8000"]
