#!/bin/sh
# The image's entrypoint and its health checks' command: `mcq "$@"`, with the Redis password read from
# the file MCQ_REDIS_PASSWORD_FILE names (a compose secret, /run/secrets/mcq_redis_password) and put
# into MCQ_REDIS_URL, which names the user only (redis://mcq@redis:6379/0). The password is then on no
# command line, in no compose file, .env or container configuration (`docker inspect`); only the mcq
# process's own environment holds it. Without MCQ_REDIS_PASSWORD_FILE, MCQ_REDIS_URL is used as it is.
set -eu

fail() {
  echo "mcq: $*" >&2
  exit 2
}

if [ -n "${MCQ_REDIS_PASSWORD_FILE:-}" ]; then
  file=$MCQ_REDIS_PASSWORD_FILE
  [ -f "$file" ] && [ -r "$file" ] || fail "MCQ_REDIS_PASSWORD_FILE=$file is not a readable file (create the secrets with ops/make-secrets.sh)"
  password=$(head -n 1 "$file")
  case $password in
    '') fail "$file holds no password on its first line (create the secrets with ops/make-secrets.sh)" ;;
    *[!A-Za-z0-9._~-]*) fail "the password in $file has characters a URL must escape: use letters, digits, '.', '_', '~', '-' (ops/make-secrets.sh makes one)" ;;
  esac
  url=${MCQ_REDIS_URL:-}
  case $url in
    redis://*@* | rediss://*@*) ;;
    *) fail "MCQ_REDIS_URL must be redis://USER@HOST:PORT/DB (or rediss://) when the password comes from MCQ_REDIS_PASSWORD_FILE" ;;
  esac
  scheme=${url%%://*}
  rest=${url#*://}
  user=${rest%%@*}
  host=${rest#*@}
  case $user in
    '' | *:* | */*) fail "MCQ_REDIS_URL must name the user and no password (redis://USER@HOST...) when the password comes from MCQ_REDIS_PASSWORD_FILE" ;;
  esac
  MCQ_REDIS_URL="$scheme://$user:$password@$host"
  export MCQ_REDIS_URL
  unset MCQ_REDIS_PASSWORD_FILE password
fi
exec mcq "$@"
