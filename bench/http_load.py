#!/usr/bin/env python3
"""http_load.py — fills a running kvrouterd with a fleet's KV-cache events and writes the query
bodies for bench/http.sh.

Workload (from ../shared/traces/synthetic_trace.jsonl, the Mooncake FAST'25 synthetic trace):
every trace hash id is expanded deterministically into 512 token ids (a 152064-token
vocabulary), so equal ids at equal places give equal prefixes. The first --requests requests
are routed to --engines engines by their first hash id (prefix affinity, like a real router);
each engine announces, through the real ZeroMQ event path, the blocks (--block-size tokens) of
its prompts that it does not hold yet, chained to the blocks it has (as vLLM does). Then the
script waits until /v1/pods shows every engine's last batch applied.

Queries: --queries bodies of exactly --query-tokens tokens, taken from the requests that follow
in the trace (multi-turn follow-ups share prefixes with stored prompts), written as
  OUT/queries.json  one JSON body per line
  OUT/queries.mp    msgpack bodies, each preceded by its length as 4 bytes big-endian
and a fixed response body of the average answer size for the nginx floor (OUT/nginx_body).
Prints a summary line per phase.
"""

import argparse
import hashlib
import http.client
import json
import os
import random
import struct
import sys
import time

import msgpack
import zmq

VOCAB = 152064
TRACE_BLOCK = 512
_expand_cache = {}


def expand(hid):
    """512 token ids for one trace hash id (deterministic)."""
    t = _expand_cache.get(hid)
    if t is None:
        raw = random.Random(hid * 2654435761 + 12345).getrandbits(32 * TRACE_BLOCK)
        words = struct.unpack("<%dI" % TRACE_BLOCK, raw.to_bytes(4 * TRACE_BLOCK, "little"))
        t = [w % VOCAB for w in words]
        _expand_cache[hid] = t
    return t


def prompt_tokens(req, limit=None):
    n = req["input_length"] if limit is None else min(limit, req["input_length"])
    out = []
    for hid in req["hash_ids"]:
        if len(out) >= n:
            break
        out.extend(expand(hid))
    return out[:n]


def chain(prev, block):
    h = hashlib.blake2b(digest_size=8)
    h.update(struct.pack("<Q", prev))
    h.update(struct.pack("<%dI" % len(block), *block))
    return int.from_bytes(h.digest(), "little") & 0x7FFFFFFFFFFFFFFF


def get_json(port, method, path, body=None, headers=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        c.request(method, path, body=body, headers=headers or {})
        r = c.getresponse()
        data = r.read()
        return r.status, data
    finally:
        c.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", required=True)
    ap.add_argument("--events", required=True, help="the daemon's bound SUB endpoint")
    ap.add_argument("--http", type=int, required=True, help="the daemon's HTTP port")
    ap.add_argument("--out", required=True)
    ap.add_argument("--engines", type=int, default=64)
    ap.add_argument("--requests", type=int, default=1024)
    ap.add_argument("--max-prompt", type=int, default=16384)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--queries", type=int, default=256)
    ap.add_argument("--query-tokens", type=int, default=8192)
    ap.add_argument("--model", default="Qwen/Qwen3-8B")
    a = ap.parse_args()

    reqs = [json.loads(line) for line in open(a.trace)]
    bs = a.block_size
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.SNDHWM, 0)
    pub.setsockopt(zmq.LINGER, 5000)
    pub.connect(a.events)
    pods = ["engine-%02d" % i for i in range(a.engines)]
    topics = {p: ("kv@%s@%s" % (p, a.model)).encode() for p in pods}
    seq = {p: -1 for p in pods}

    def send(pod, events):
        seq[pod] += 1
        payload = msgpack.packb([time.time(), events, 0], use_bin_type=True)
        pub.send_multipart([topics[pod], struct.pack(">Q", seq[pod]), payload])

    def applied():
        st, data = get_json(a.http, "GET", "/v1/pods")
        if st != 200:
            return {}
        return {s["pod"]: s["last_seq"] for s in json.loads(data)["pods"]}

    # slow joiner: AllBlocksCleared to every engine until all are visible
    t0 = time.monotonic()
    while True:
        for p in pods:
            send(p, [{"type": "AllBlocksCleared"}])
        time.sleep(0.2)
        seen = applied()
        if all(seen.get(p, -1) >= 0 for p in pods):
            break
        if time.monotonic() - t0 > 30:
            sys.exit("http_load: events never reached the daemon (%d/%d streams)"
                     % (len(seen), len(pods)))

    held = {p: set() for p in pods}
    blocks = 0
    t0 = time.monotonic()
    for req in reqs[:a.requests]:
        pod = pods[req["hash_ids"][0] % a.engines]
        toks = prompt_tokens(req, a.max_prompt)
        nb = len(toks) // bs
        prev, parent, hashes, start = 0, None, [], None
        for i in range(nb):
            block = toks[i * bs:(i + 1) * bs]
            h = chain(prev, block)
            if h in held[pod]:
                parent, prev = h, h
                continue
            if start is None:
                start = i
            hashes.append(h)
            held[pod].add(h)
            prev = h
        if not hashes:
            continue
        blocks += len(hashes)
        send(pod, [{"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
                    "token_ids": toks[start * bs:(start + len(hashes)) * bs],
                    "block_size": bs, "lora_id": None, "medium": "GPU", "lora_name": None}])
    deadline = time.monotonic() + 120
    while True:
        seen = applied()
        if all(seen.get(p, -1) >= seq[p] for p in pods):
            break
        if time.monotonic() > deadline:
            sys.exit("http_load: daemon did not apply all batches in 120 s")
        time.sleep(0.2)
    print("load: %d engines, %d requests, %d blocks of %d tokens stored in %.1f s"
          % (a.engines, a.requests, blocks, bs, time.monotonic() - t0))
    pub.close()
    ctx.term()

    # queries: following requests with at least query_tokens tokens
    os.makedirs(a.out, exist_ok=True)
    cand = [r for r in reqs[a.requests:] if r["input_length"] >= a.query_tokens]
    if len(cand) < a.queries:
        cand += [r for r in reqs[:a.requests] if r["input_length"] >= a.query_tokens]
    step = max(1, len(cand) // a.queries)
    chosen = cand[::step][:a.queries]
    sizes, matched, jlen, mlen = [], [], 0, 0
    with open(os.path.join(a.out, "queries.json"), "w") as fj, \
            open(os.path.join(a.out, "queries.mp"), "wb") as fm:
        for r in chosen:
            toks = prompt_tokens(r, a.query_tokens)
            q = {"model": a.model, "token_ids": toks}
            js = json.dumps(q)
            fj.write(js + "\n")
            mp = msgpack.packb(q)
            fm.write(struct.pack(">I", len(mp)) + mp)
            jlen += len(js)
            mlen += len(mp)
            st, data = get_json(a.http, "POST", "/v1/score", js.encode(),
                                {"Content-Type": "application/json"})
            if st != 200:
                sys.exit("http_load: query failed: %s %s" % (st, data[:200]))
            ans = json.loads(data)
            sizes.append(len(data))
            best = max([e["matched_blocks"] for e in ans["scores"]] or [0])
            matched.append(best / max(1, ans["query_blocks"]))
    avg = sum(sizes) // len(sizes)
    with open(os.path.join(a.out, "nginx_body"), "w") as f:
        body = '{"model":"x","block_size":16,"query_blocks":512,"scores":[]}'
        f.write(body + " " * max(0, avg - len(body) - 1) + "\n")
    print("queries: %d bodies of %d tokens, JSON %.1f KB avg, msgpack %.1f KB avg, "
          "answer %d B avg, best-match fraction avg %.2f, %d%% with a match"
          % (len(chosen), a.query_tokens, jlen / len(chosen) / 1024, mlen / len(chosen) / 1024,
             avg, sum(matched) / len(matched),
             100 * sum(1 for m in matched if m > 0) // len(matched)))


if __name__ == "__main__":
    main()
