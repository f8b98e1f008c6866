#!/usr/bin/env bash
# The conformance suite through the remote plugin, against `backplane serve`
# with TLS and a token on loopback (a self-signed certificate made here),
# serving the CPU plugin and vulkan0 where the machine has it; then one graph
# split across a remote device and the local CPU.
set -euo pipefail
bp="$1"
dir=$(mktemp -d)
pid=""
cleanup() { [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT
openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj "/CN=127.0.0.1" \
  -addext "subjectAltName=IP:127.0.0.1" -keyout "$dir/key.pem" -out "$dir/cert.pem" 2>/dev/null
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$dir/token"
plugins=(--plugin cpu)
if "$bp" devices --load | grep -q '^vulkan0'; then plugins+=(--plugin vulkan); fi
"$bp" serve --listen 127.0.0.1:0 --token-file "$dir/token" --tls-cert "$dir/cert.pem" --tls-key "$dir/key.pem" \
  "${plugins[@]}" > "$dir/serve.log" 2>&1 &
pid=$!
for _ in $(seq 200); do grep -q listening "$dir/serve.log" && break; sleep 0.1; done
cat "$dir/serve.log"
port=$(sed -n 's/.*listening on 127\.0\.0\.1:\([0-9]*\).*/\1/p' "$dir/serve.log")
[ -n "$port" ] || { echo "the server did not start"; exit 1; }
export BACKPLANE_REMOTE="127.0.0.1:$port" BACKPLANE_REMOTE_TOKEN_FILE="$dir/token" BACKPLANE_REMOTE_CA_FILE="$dir/cert.pem"
"$bp" devices --load | grep "@127.0.0.1:$port"
"$bp" conformance --plugin remote --quick --quiet
# Without the certificate to trust, a TLS server is not reached.
if BACKPLANE_REMOTE_CA_FILE= "$bp" devices --load 2>&1 | grep -q "^cpu@127"; then
  echo "a client without the CA reached the TLS server"; exit 1
fi
echo "remote conformance over TLS: passed"
