#!/usr/bin/env bash
# Fails when a test log holds key material: a PEM private key, a Bearer
# credential, or a JSON Web Token (ServiceAccount tokens are JWTs). Every
# file under the given directories is searched (the tier logs of
# hack/test.sh and the logs of the processes tests start, kept beside them
# as kube-*/ and the like).
#
# Usage: hack/scan-logs.sh DIR...     exit 0: clean; 1: found (each hit is
#                                     printed as file:line with the secret
#                                     cut short); 2: usage
set -uo pipefail

[ $# -gt 0 ] || { echo "usage: $0 DIR..." >&2; exit 2; }

# A PEM private key of any kind (PKCS#8, RSA, EC, encrypted).
PEM='-----BEGIN ([A-Z0-9]+ )*PRIVATE KEY-----'
# An HTTP Authorization value with a credential (client-go prints
# "Bearer <masked>" at high verbosity, which is fine).
BEARER='Bearer [A-Za-z0-9._~+/=-]{16,}'
# header.payload.signature, base64url; a JSON header starts with eyJ ("{").
JWT='eyJ[A-Za-z0-9_-]{10,}\.eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}'

found=0
for dir in "$@"; do
  [ -d "$dir" ] || { echo "scan-logs: no directory $dir" >&2; exit 2; }
  # -a: a log with a stray binary byte is still searched as text.
  hits=$(grep -r -a -n -E -o -e "$PEM|$BEARER|$JWT" -- "$dir" 2>/dev/null || true)
  if [ -n "$hits" ]; then
    found=1
    # file:line and what was found, not the secret itself.
    printf '%s\n' "$hits" | awk -F: '{
        kind = "a JSON Web Token"
        if ($0 ~ /PRIVATE KEY/) kind = "a PEM private key"
        else if ($0 ~ /Bearer /) kind = "a Bearer credential"
        printf "  %s:%s: %s\n", $1, $2, kind
      }' | sort -u
  fi
done

if [ "$found" = 1 ]; then
  echo "scan-logs: key material in the test logs above (a program or test printed a secret)" >&2
  exit 1
fi
echo "scan-logs: no key material in $*"
