# SparkOps in a container, to run beside the engines on a DGX Spark (compose.yaml runs it).
#
#   docker build -t localhost/sparkops:0.2.0 .   # Podman: podman build --format docker ...
#   docker compose up -d                         # the way it is meant to run (compose.yaml)
#
# The image holds the application (/opt/sparkops/app, owned by root) and a virtual environment
# installed from the hashed lock (/opt/sparkops/venv); it runs as the unprivileged user
# sparkops (uid and gid 10001) and keeps everything it writes in /var/lib/sparkops (a volume).
# BASE may be any Debian bookworm root that has python3 and python3-venv already (the tests
# build on one made by debootstrap). Podman keeps the HEALTHCHECK only with --format docker.
ARG BASE=docker.io/library/python:3.12-slim-bookworm
FROM ${BASE}

ARG SPARKOPS_UID=10001
ARG SPARKOPS_GID=10001

# The account the stack runs as: no login shell, its home the data directory.
RUN groupadd --system --gid "${SPARKOPS_GID}" sparkops \
 && useradd --system --uid "${SPARKOPS_UID}" --gid "${SPARKOPS_GID}" --no-create-home \
      --home-dir /var/lib/sparkops --shell /usr/sbin/nologin sparkops \
 && install -d -o "${SPARKOPS_UID}" -g "${SPARKOPS_GID}" -m 0700 /var/lib/sparkops

# Dependencies first (a layer that survives changes to the code), only from the lock, every
# file checked against its hash.
COPY requirements.lock /opt/sparkops/app/requirements.lock
RUN python3 -m venv /opt/sparkops/venv \
 && /opt/sparkops/venv/bin/python -m pip install --no-cache-dir --disable-pip-version-check \
      --require-hashes --no-deps -r /opt/sparkops/app/requirements.lock

# The application, read-only for the user that runs it.
COPY . /opt/sparkops/app
WORKDIR /opt/sparkops/app
RUN find /opt/sparkops/app \( ! -perm -a+r -o -perm /go+w \) -exec chmod a+rX,go-w {} + \
 && /opt/sparkops/venv/bin/python -m compileall -q -j 0 /opt/sparkops/app >/dev/null

# `bin/sparkops start` must install nothing here (the venv and the app are read-only at run
# time), so its own install step (ensure_venv) runs now, with no package index: it finds the
# lock installed and writes the venv's stamp that it checks on every start, or this build fails.
# The rest of that start runs too, on a throw-away data directory (migrate, bootstrap,
# collectstatic, then `runstack --help` instead of the stack): an image that builds, starts.
RUN check=$(mktemp -d) \
 && if ! SPARKOPS_VENV=/opt/sparkops/venv PIP_NO_INDEX=1 SPARKOPS_DATA_DIR="$check/data" \
         SPARKOPS_SECRET_KEY=build-check SPARKOPS_ADMIN_PASSWORD=build-check-password \
         bin/sparkops start --help >"$check/log" 2>&1; then cat "$check/log"; exit 1; fi \
 && rm -rf "$check"

ENV SPARKOPS_VENV=/opt/sparkops/venv \
    SPARKOPS_DATA_DIR=/var/lib/sparkops \
    SPARKOPS_BIND=0.0.0.0:8470 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1

USER sparkops:sparkops
VOLUME ["/var/lib/sparkops"]
EXPOSE 8470

# Liveness: the web server answers on its bind address (a wildcard bind is asked on loopback).
# Any answer below 500 counts, so a Host narrowed out by SPARKOPS_ALLOWED_HOSTS (400) still
# reads as alive; /readyz, not this, says whether collection is current.
HEALTHCHECK --interval=30s --timeout=10s --start-period=180s --retries=3 \
  CMD ["/opt/sparkops/venv/bin/python", "-c", "import http.client, os; \
       bind = os.environ.get('SPARKOPS_BIND') or '0.0.0.0:8470'; \
       host, _, port = bind.rpartition(':') if bind.rpartition(':')[2].isdigit() \
           else (bind, '', '8470'); \
       host = {'': '127.0.0.1', '0.0.0.0': '127.0.0.1', '[::]': '::1', '::': '::1'}.get( \
           host, host.strip('[]')); \
       connection = http.client.HTTPConnection(host, int(port), timeout=8); \
       connection.request('GET', '/healthz'); \
       raise SystemExit(connection.getresponse().status >= 500)"]

# bin/sparkops start: migrate, create the first admin, collect the static files into the data
# directory, then the supervised stack (web, Celery worker with beat); it installs nothing,
# since the venv's stamp matches the lock.
CMD ["/opt/sparkops/app/bin/sparkops", "start"]
