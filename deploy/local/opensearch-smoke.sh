#!/usr/bin/env bash
# Smoke test for a running local OpenSearch (deploy/local/opensearch.sh start): k-NN plugin present,
# knn_vector(384, hnsw, lucene, cosinesimil) index, knn / filtered knn / BM25 match / _msearch.
# Usage: opensearch-smoke.sh   (uses RAGLINE_OPENSEARCH_PORT, default 9200; creates and deletes one index)
set -euo pipefail
URL=http://127.0.0.1:${RAGLINE_OPENSEARCH_PORT:-9200}
IDX=ragline-smoke-$$
DIM=384
fail() { printf 'smoke: FAIL: %s\n' "$*" >&2; exit 1; }
ok() { printf 'smoke: ok: %s\n' "$*"; }
req() { # METHOD PATH [BODY] [content-type]
  curl -sS --max-time 30 -X "$1" "$URL$2" -H "Content-Type: ${4:-application/json}" ${3:+--data-binary "$3"}
}
trap 'req DELETE "/$IDX" >/dev/null 2>&1 || true' EXIT

# a 384-dim one-hot-ish vector: weight 1 at position $1, small weight $2 at position $1+1
vec() { python3 -c "import sys,json;d=$DIM;i=int(sys.argv[1]);v=[0.0]*d;v[i]=1.0;v[(i+1)%d]=float(sys.argv[2]);print(json.dumps(v))" "$1" "$2"; }

req GET /_cat/plugins | grep -q opensearch-knn || fail "opensearch-knn not in _cat/plugins"
ok "opensearch-knn in _cat/plugins"

req PUT "/$IDX" "{
  \"settings\": {\"index.knn\": true, \"number_of_shards\": 1, \"number_of_replicas\": 0},
  \"mappings\": {\"properties\": {
    \"embedding\": {\"type\": \"knn_vector\", \"dimension\": $DIM,
      \"method\": {\"name\": \"hnsw\", \"engine\": \"lucene\", \"space_type\": \"cosinesimil\"}},
    \"text\": {\"type\": \"text\"},
    \"tenant\": {\"type\": \"keyword\"}}}}" | grep -q '"acknowledged":true' || fail "create index"
ok "index with knn_vector($DIM, hnsw, lucene, cosinesimil) created"

bulk=""
bulk+="{\"index\":{\"_index\":\"$IDX\",\"_id\":\"a\"}}"$'\n'"{\"text\":\"the quick brown fox\",\"tenant\":\"t1\",\"embedding\":$(vec 0 0.1)}"$'\n'
bulk+="{\"index\":{\"_index\":\"$IDX\",\"_id\":\"b\"}}"$'\n'"{\"text\":\"lazy dogs sleep all day\",\"tenant\":\"t2\",\"embedding\":$(vec 0 0.3)}"$'\n'
bulk+="{\"index\":{\"_index\":\"$IDX\",\"_id\":\"c\"}}"$'\n'"{\"text\":\"vector search with opensearch\",\"tenant\":\"t1\",\"embedding\":$(vec 10 0.0)}"$'\n'
bulk+="{\"index\":{\"_index\":\"$IDX\",\"_id\":\"d\"}}"$'\n'"{\"text\":\"hybrid retrieval bm25 and knn\",\"tenant\":\"t2\",\"embedding\":$(vec 20 0.0)}"$'\n'
req POST "/_bulk?refresh=true" "$bulk" application/x-ndjson | grep -q '"errors":false' || fail "bulk index"
ok "4 docs indexed"

q=$(vec 0 0.05)
ids() { python3 -c 'import sys,json;r=json.load(sys.stdin);print(" ".join(h["_id"] for h in r["hits"]["hits"]))'; }
got=$(req POST "/$IDX/_search" "{\"size\":2,\"_source\":false,\"query\":{\"knn\":{\"embedding\":{\"vector\":$q,\"k\":2}}}}" | ids)
[ "$got" = "a b" ] || fail "knn nearest by cosine: expected 'a b', got '$got'"
ok "knn query returns nearest by cosine: $got"

got=$(req POST "/$IDX/_search" "{\"size\":2,\"_source\":false,\"query\":{\"knn\":{\"embedding\":{\"vector\":$q,\"k\":2,
  \"filter\":{\"term\":{\"tenant\":\"t2\"}}}}}}" | ids)
[ "${got%% *}" = "b" ] && [[ " $got " != *" a "* ]] && [[ " $got " != *" c "* ]] || fail "filtered knn: expected b first and only t2 docs, got '$got'"
ok "filtered knn (filter inside knn clause) honours the filter: $got"

got=$(req POST "/$IDX/_search" '{"query":{"match":{"text":"lazy dogs"}}}' | ids)
[ "${got%% *}" = "b" ] || fail "BM25 match: expected b first, got '$got'"
ok "BM25 match query: $got"

ms="{\"index\":\"$IDX\"}"$'\n'"{\"size\":1,\"_source\":false,\"query\":{\"match\":{\"text\":\"opensearch\"}}}"$'\n'
ms+="{\"index\":\"$IDX\"}"$'\n'"{\"size\":1,\"_source\":false,\"query\":{\"knn\":{\"embedding\":{\"vector\":$(vec 20 0.0),\"k\":1}}}}"$'\n'
got=$(req POST /_msearch "$ms" application/x-ndjson |
  python3 -c 'import sys,json;r=json.load(sys.stdin);print(" ".join(x["hits"]["hits"][0]["_id"] for x in r["responses"]))')
[ "$got" = "c d" ] || fail "_msearch: expected 'c d', got '$got'"
ok "_msearch (BM25 + knn): $got"
echo "smoke: all checks passed against $URL"
