#!/usr/bin/env bash
# capture_etcd_seeds.sh — writes corpus/fuzz_etcd_answer/ from a real etcd (docs/fuzzing.md).
#
# Starts a private one-member etcd (tests/elastic/support/start_etcd.sh), sends it the requests
# the etcd client sends (and a few it refuses), and stores each answer body as one seed of
# fuzz_etcd_answer: byte 0 the HTTP status's index in the target's table (200 400 404 500
# 503), byte 1 the txn branch sizes (one op each: 0x11), then the body exactly as received.
# Run it by hand after an etcd upgrade; the seeds in git came from etcd 3.4.23.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if [[ ${1:-} != --inside ]]; then
  exec bash "$here/../elastic/support/start_etcd.sh" -- bash "$0" --inside
fi
out=$here/corpus/fuzz_etcd_answer
mkdir -p "$out"
ep=${KRAB_TEST_ETCD_ENDPOINTS%%,*}
b64() { printf '%s' "$1" | base64 -w0; }
# seed NAME PATH JSON: POSTs JSON to PATH and writes the seed.
seed() {
  local body status index
  body=$(mktemp)
  status=$(curl -s -m 5 -o "$body" -w '%{http_code}' -X POST -H 'Content-Type: application/json' \
           "http://$ep$2" -d "$3")
  case $status in 200) index=0 ;; 400) index=1 ;; 404) index=2 ;; 500) index=3 ;; 503) index=4 ;;
    *) echo "capture_etcd_seeds.sh: $1: HTTP $status has no index" >&2; exit 1 ;; esac
  { printf "\\x0$index\\x11"; cat "$body"; } >"$out/$1"
  rm -f "$body"
  echo "$1: HTTP $status, $(($(wc -c <"$out/$1") - 2)) bytes"
}
k=$(b64 job/leader) v=$(printf 'agent-0\000\377' | base64 -w0)  # a value with a NUL and 0xff
seed put /v3/kv/put "{\"key\":\"$k\",\"value\":\"$v\"}"
seed range-hit /v3/kv/range "{\"key\":\"$k\"}"
seed range-miss /v3/kv/range "{\"key\":\"$(b64 absent)\"}"
seed put-second /v3/kv/put "{\"key\":\"$(b64 job/members/1)\",\"value\":\"$(b64 1)\"}"
seed range-prefix /v3/kv/range "{\"key\":\"$(b64 job/)\",\"range_end\":\"$(b64 job0)\"}"
lease=$(curl -s -m 5 -X POST "http://$ep/v3/lease/grant" -d '{"TTL":"30"}' |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["ID"])')
seed grant /v3/lease/grant '{"TTL":"30"}'
seed put-lease /v3/kv/put "{\"key\":\"$(b64 job/agents/a)\",\"value\":\"$v\",\"lease\":\"$lease\"}"
seed keepalive /v3/lease/keepalive "{\"ID\":\"$lease\"}"
seed keepalive-unknown /v3/lease/keepalive '{"ID":"12345"}'
seed revoke-unknown /v3/lease/revoke '{"ID":"12345"}'
seed put-unknown-lease /v3/kv/put "{\"key\":\"$k\",\"value\":\"$v\",\"lease\":\"12345\"}"
seed put-empty-key /v3/kv/put '{"value":"eA=="}'
seed txn-succeeded /v3/kv/txn "{\"compare\":[{\"key\":\"$k\",\"target\":\"VALUE\",\"result\":\"EQUAL\",\"value\":\"$v\"}],\"success\":[{\"request_range\":{\"key\":\"$k\"}}],\"failure\":[{\"request_put\":{\"key\":\"$k\",\"value\":\"$v\"}}]}"
seed txn-failed /v3/kv/txn "{\"compare\":[{\"key\":\"$k\",\"target\":\"CREATE\",\"result\":\"EQUAL\",\"create_revision\":\"0\"}],\"success\":[{\"request_put\":{\"key\":\"$k\",\"value\":\"$v\"}}],\"failure\":[{\"request_range\":{\"key\":\"$k\"}}]}"
seed delete-prefix /v3/kv/deleterange "{\"key\":\"$(b64 job/)\",\"range_end\":\"$(b64 job0)\"}"
seed status /v3/maintenance/status '{}'
