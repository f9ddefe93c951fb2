# One image for web, worker, beat and sandbox (docker-compose.yml picks the command).
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY agentflow ./agentflow
COPY refunds ./refunds
RUN pip install --no-cache-dir .
COPY . .
RUN DJANGO_SECRET_KEY=build python manage.py collectstatic --noinput
