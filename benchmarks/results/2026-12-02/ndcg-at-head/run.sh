#!/bin/bash
# nDCG@10 (lexical, hybrid) on every shared data set with the lexical index off, then in memory.
set -e
cd /work/main
export RAG_DATA_DIR=/tmp/mnemo-ndcg-data
export RAG_SIDECAR_URL=http://127.0.0.1:8771
RAG_SIDECAR_PORT=8771 .venv/bin/mnemo sidecar > /work/bench/ndcg/sidecar.log 2>&1 &
SIDECAR=$!
trap "kill -INT $SIDECAR; sleep 5; kill $SIDECAR 2>/dev/null" EXIT
for i in $(seq 1 180); do curl -sf http://127.0.0.1:8771/models > /dev/null && break; sleep 2; done
for ds in adi med cacm xquad-es xquad-de; do
  for mode in off memory; do
    RAG_LEXICAL_INDEX=$mode .venv/bin/mnemo eval --dataset /work/shared/datasets/$ds --modes lexical,hybrid \
      --no-references --keep --json /work/bench/ndcg/$ds-$mode.json > /work/bench/ndcg/$ds-$mode.log 2>&1
    echo "$ds $mode done $(date +%T)"
  done
done
