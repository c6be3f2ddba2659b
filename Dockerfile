# mc_queue workers and sweeper. Build: docker build -t mc_queue .
FROM python:3.11.9-slim-bookworm
RUN apt-get update && apt-get install -y --no-install-recommends git && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml README.md ./
COPY mc_queue ./mc_queue
COPY lua ./lua
COPY workers ./workers
RUN pip install --no-cache-dir . && useradd --create-home mcq
# /data: where docker-compose.yml mounts the example's git remote (a new named volume takes this owner).
RUN mkdir -p /data && chown mcq /data
USER mcq
# mcq reads the Redis password from the file MCQ_REDIS_PASSWORD_FILE names (docker-compose.yml's secret).
ENTRYPOINT ["mcq"]
