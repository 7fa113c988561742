#!/usr/bin/env bash
# Installs everything the test suite needs on a fresh machine, then runs the whole suite.
# Idempotent: a second run reuses what is installed. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/../.."

PYTHON=${PYTHON:-python3}

# 1. PostgreSQL on 127.0.0.1:5432 with a database "test" (trust auth on this kind of machine).
if ! pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then
  echo "== starting PostgreSQL"
  if command -v pg_ctlcluster >/dev/null && ls /etc/postgresql >/dev/null 2>&1; then
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start
  else
    echo "PostgreSQL is not installed; installing it" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start
  fi
  for _ in $(seq 1 30); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 1; done
fi
psql -h 127.0.0.1 -U postgres -tAc "SELECT 1 FROM pg_database WHERE datname='test'" | grep -q 1 \
  || psql -h 127.0.0.1 -U postgres -c "CREATE DATABASE test" >/dev/null

# 1b. Redis on 127.0.0.1:6379 (the cluster tests; each uses its own key prefix). The Redis-restart
#     test starts its own redis-server on a free port, so the binary must be there too.
if ! command -v redis-server >/dev/null; then
  echo "== installing redis-server"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
fi
if ! redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null | grep -q PONG; then
  echo "== starting Redis"
  redis-server --bind 127.0.0.1 --port 6379 --daemonize yes --save "" --appendonly no >/dev/null
  for _ in $(seq 1 30); do redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null | grep -q PONG && break; sleep 1; done
fi

# 2. Chromium for the console's browser tests (Playwright drives the system browser: its own
#    browser download needs the internet).
if [ ! -x /usr/bin/chromium ]; then
  echo "== installing chromium"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi

# 2b. bubblewrap: the agents' sandbox (the built-in `sandbox_agent`), and setpriv (util-linux) with it.
if ! command -v bwrap >/dev/null; then
  echo "== installing bubblewrap"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null
fi

# 3. The gateway with its test extras (Playwright for Python among them), and the example plugin's build tools.
echo "== installing agent-gateway[test]"
"$PYTHON" -m pip install -q --disable-pip-version-check -e ".[test]"
# An editable install is not compiled, and where PYTHONDONTWRITEBYTECODE is set no process writes
# bytecode: each of the suite's ~130 gateway and CLI subprocesses would compile the package again
# (about 0.1 s of CPU each). Compiled once here instead.
"$PYTHON" -m compileall -q -j 0 gateway plugins hookspecs > /dev/null

# 4. The real agent peers (Reasonix, Hermes, Pi, LightRAG) in their own folders and venvs, and the
#    Node clients the tests drive (@ag-ui/client, the Vercel AI SDK, LangChain.js).
echo "== installing agent peers (Reasonix, Hermes, Pi, LightRAG) and Node clients"
peers_env=$(mktemp)
bash contrib/peers/install.sh > "$peers_env"   # fails loudly: set -e
while IFS='=' read -r key value; do
  [[ "$key" =~ ^[A-Z_]+$ ]] && export "$key=$value"
done < "$peers_env"
rm -f "$peers_env"

# 5. The suite.
echo "== running tests"
set +e
# Three workers on two cores: a test waits on a subprocess, a peer or the network about a third of
# its time, so a third worker fills that idle CPU (docs/testing.md has the figures).
"$PYTHON" -m pytest -q -p no:cacheprovider -n 3 "$@"
status=$?
set -e
# pytest exits 5 when nothing was collected: that is a failure here.
exit $status
