#!/usr/bin/env bash
# Runs the whole system on the embedded SQLite default: the resource store and the
# scheduler API (`berth serve`) with the example cloud's hosts registered through their
# compute agents, then boots instances against it (`berth boot`) and stops the server.
# The fake compute driver is told that builds on c1-s08 and c1-s10 (the best hosts for
# m1.large) fail, so the first boot shows the conductor rescheduling onto alternates.
# Then an instance of the cloud file is migrated, confirmed, resized and reverted.
set -euo pipefail
BIN=${BIN:-.venv/bin}
work=$(mktemp -d)
port=${BERTH_DEMO_PORT:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
url="http://127.0.0.1:${port}"

"$BIN/berth" serve --auth-strategy noauth2 --db "sqlite:///${work}/berth.sqlite" --port "$port" --seed 7 \
    --cloud examples/cloud.yaml --config-file examples/nova.conf \
    --fail-host c1-s08 --fail-host c1-s10 >"${work}/serve.log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null; wait "$server" 2>/dev/null; rm -rf "$work"' EXIT

for _ in $(seq 1 120); do
    if curl -sf "${url}/healthz" >/dev/null 2>&1; then break; fi
    if ! kill -0 "$server" 2>/dev/null; then cat "${work}/serve.log"; exit 1; fi
    sleep 0.5
done

echo "== berth serve is up at ${url}; the two requests scheduled offline above, online:"
echo "   2 x avx512.large in az1: only hosts whose agents report HW_CPU_X86_AVX512F"
"$BIN/berth" boot --url "$url" --flavor avx512.large --az az1 --num 2
echo "   2 x m1.large in az3: placement only offers az3's hosts; the same two hosts as offline"
echo "   (equal hosts fall in the order of the instance uuids, which are not the offline run's)"
"$BIN/berth" boot --url "$url" --flavor m1.large --az az3 --num 2
echo "== booting 3 x m1.large (ubuntu) through placement claims"
echo "   (builds fail on c1-s08 and c1-s10: 'tried' lists the hosts before the alternate that built it)"
"$BIN/berth" boot --url "$url" --flavor m1.large --image ubuntu --num 3
echo "== booting 2 x ssd.large"
"$BIN/berth" boot --url "$url" --flavor ssd.large --num 2
echo "== 24 vCPU, 256 GiB fits nowhere: placement's own reasons, node by node (NoValidHost, exit 4)"
"$BIN/berth" boot --url "$url" --flavor 24,262144,100 --explain || [ $? -eq 4 ]

# Moves of an instance the cloud file lists: web member 0b8f...01 runs on c1-w01 in the
# anti-affinity group "web" (its other member is on c1-w02).
web1=0b8f9c3e-0000-4000-8000-000000000001
echo "== cold-migrate ${web1}: its host ignored, c1-w02 kept out by anti-affinity; the"
echo "   instance consumer gets the destination, the migration consumer keeps the source"
echo "   (a failed build on c1-s08/c1-s10 goes on to the next alternate, as for a boot)"
"$BIN/berth" migrate "$web1" --url "$url"
echo "== confirm: the migration consumer's allocation on the source is deleted"
"$BIN/berth" confirm-resize "$web1" --url "$url"
echo "== resize it to m1.large, then revert: back where it was, with its old flavor"
"$BIN/berth" resize "$web1" --flavor m1.large --url "$url"
"$BIN/berth" revert-resize "$web1" --url "$url"
echo "== an operator takes c1-s01 out of scheduling, then brings it back (Nova's os-services:"
echo "   its agent publishes COMPUTE_STATUS_DISABLED; 'berth service list' shows every host)"
"$BIN/berth" service set c1-s01 --disable --disable-reason "disk replacement" --url "$url"
"$BIN/berth" service set c1-s01 --enable --url "$url"
