#!/bin/sh
# Creates the two secrets docker-compose.yml mounts (run it once, next to docker-compose.yml):
#
#   secrets/mcq_redis_password  the mcq Redis user's password (a random 64-character hex string); the mcq
#                               containers read it (MCQ_REDIS_PASSWORD_FILE), redis's health check too
#   secrets/redis_users.acl     redis-server's ACL file (--aclfile): the default user off, and the mcq user
#                               with that password's SHA-256 (not the password), limited to the namespace's
#                               keys, RQ's keys and channels, and the commands mc_queue and RQ use
#
# Usage: ops/make-secrets.sh [PREFIX] [DIR]   PREFIX: the namespace (MCQ_PREFIX, default mcq);
#                                             DIR: where to write (MCQ_SECRETS_DIR, default ./secrets)
# It refuses to overwrite existing secrets. Neither file goes on any command line or into the environment
# of a container; both are mounted read-only at /run/secrets/. DIR is made private to you (0700); the files
# inside are readable by anyone who can enter DIR (0444), because the containers' users (redis, mcq) are
# not you: with compose's file secrets the mounted file keeps the host file's mode.
set -eu
prefix=${1:-${MCQ_PREFIX:-mcq}}
dir=${2:-${MCQ_SECRETS_DIR:-./secrets}}

case $prefix in
  '' | *[!A-Za-z0-9_.:-]* | [!A-Za-z0-9]*)
    echo "make-secrets: invalid prefix '$prefix': use letters, digits, '_', '.', ':', '-', starting with a letter or digit" >&2
    exit 2 ;;
esac
if [ "${#prefix}" -gt 64 ]; then
  echo "make-secrets: invalid prefix '$prefix': at most 64 characters" >&2
  exit 2
fi
for f in mcq_redis_password redis_users.acl; do
  if [ -e "$dir/$f" ]; then
    echo "make-secrets: $dir/$f exists; remove it first to make new secrets (and restart redis and every mcq container)" >&2
    exit 2
  fi
done

umask 077
mkdir -p "$dir"
chmod 0700 "$dir"
password=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
[ "${#password}" -eq 64 ] || { echo "make-secrets: could not read 32 random bytes from /dev/urandom" >&2; exit 1; }
hash=$(printf '%s' "$password" | sha256sum | cut -c1-64)

printf '%s\n' "$password" > "$dir/mcq_redis_password"
# resetkeys/resetchannels first: the rules below are all this user gets.
#   keys:     {PREFIX}:* (every key of the namespace carries the hash tag {PREFIX}) and rq:* (RQ's)
#   channels: rq:pubsub:* (an RQ worker listens there for commands)
#   commands: reading and writing data, scripts, transactions, pub/sub and the connection's own commands,
#             none of the dangerous ones (FLUSHALL, CONFIG, KEYS, DEBUG, SHUTDOWN, ...), except INFO
#             (replication lineage, memory headroom, metrics); and TIME (Redis's clock)
printf 'user default off resetkeys resetchannels -@all\nuser mcq on #%s resetkeys ~{%s}:* ~rq:* resetchannels &rq:pubsub:* -@all +@read +@write +@keyspace +@scripting +@transaction +@pubsub +@connection -@dangerous +info +time\n' \
  "$hash" "$prefix" > "$dir/redis_users.acl"
chmod 0444 "$dir/mcq_redis_password" "$dir/redis_users.acl"
[ -e "$dir/.gitignore" ] || printf '# secrets: never committed\n*\n' > "$dir/.gitignore"
echo "wrote $dir/mcq_redis_password and $dir/redis_users.acl (namespace prefix '$prefix')"
