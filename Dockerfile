# mc_queue workers and sweeper. Build: docker build -t mc_queue .
FROM python:3.11-slim
RUN apt-get update && apt-get install -y --no-install-recommends git && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml README.md ./
COPY mc_queue ./mc_queue
COPY lua ./lua
COPY workers ./workers
RUN pip install --no-cache-dir . && useradd --create-home mcq
USER mcq
ENTRYPOINT ["mcq"]
