#!/usr/bin/env bash
# A CA and one certificate + key signed by it, for a Dask cluster's TLS (see README.md).
# Usage: bash make_certificates.sh OUT_DIR [HOSTNAME ...]  (default names: localhost, 127.0.0.1)
set -euo pipefail
out=${1:?usage: make_certificates.sh OUT_DIR [HOSTNAME ...]}
shift
names=("${@:-localhost}")
mkdir -p "$out"
umask 077
san="IP:127.0.0.1"
for name in "${names[@]}"; do san="$san,DNS:$name"; done
openssl req -x509 -newkey rsa:2048 -nodes -days 365 -subj "/CN=fgscale-dask-ca" \
    -keyout "$out/ca.key" -out "$out/ca.pem"
openssl req -newkey rsa:2048 -nodes -subj "/CN=${names[0]}" \
    -keyout "$out/node.key" -out "$out/node.csr"
printf "subjectAltName=%s\n" "$san" > "$out/node.ext"
openssl x509 -req -in "$out/node.csr" -CA "$out/ca.pem" -CAkey "$out/ca.key" \
    -CAcreateserial -days 365 -extfile "$out/node.ext" -out "$out/node.pem"
rm -f "$out/node.csr" "$out/node.ext"
echo "wrote $out/ca.pem, $out/node.pem, $out/node.key (keep ca.key offline)"
