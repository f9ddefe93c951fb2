# One image for web, worker, beat and sandbox (docker-compose.yml picks the command).
# The base is pinned to an exact release; bump it on purpose (and rebuild) for Python fixes.
FROM python:3.11.14-slim-bookworm
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    AGENTFLOW_VAR_DIR=/app/var
WORKDIR /app
# Dependencies first, exactly as locked (every file hash-checked), so code edits reuse the layer.
COPY requirements.lock ./
RUN pip install --no-cache-dir --require-hashes --no-deps -r requirements.lock
COPY . .
RUN pip install --no-cache-dir --no-deps . \
 && DJANGO_DEBUG=1 python manage.py collectstatic --noinput \
 && useradd --system --user-group --uid 10001 --home-dir /app --no-create-home agentflow \
 && mkdir -p var/sandbox var/metrics \
 && chown -R agentflow:agentflow var
# Not root: a compromised process cannot rewrite the code or the image's Python.
USER agentflow
