#!/usr/bin/python3
"""text_threads_bench.py — what a large text costs the other requests of its loop (issue #27),
for one or more kvrouterd binaries in the same run (bench/text_threads.sh drives it).

Every daemon: [http] threads = 1, Gemma 3 and Qwen3 from build/tokref, prefix cache off (each
large prompt is new anyway). Probes: one connection asks GET /healthz every 10 ms, another a
small POST /v1/score (64 token ids) every 10 ms, on the same listener; their latencies are
what a health checker and a gateway see. Load comes from another process (no GIL shared with
the probes). Scenarios:
  idle      probes only (the noise floor)
  big       one client sending 1 MiB Gemma 3 prompts to /v1/score back to back
            ([http] max_query_tokens = 1048576 so they are tokenized, not refused)
  chat      64 connections each sending 32 KiB Qwen3 chat bodies (/v1/score) back to back
  handoff   a 2 KiB prompt (and 8, 16, 32, 64 KiB ones) to /v1/score, one at a time: latency
            (the "after" daemons also run once with [tokenizer] offload_bytes = 0: every text
            handed off, which shows what the hand-off costs and where it pays)
  refuse    a 1 MiB Gemma 3 / Qwen3 prompt over the default max_query_tokens (262144): time to
            the 413
Prints medians and p99 per binary and scenario.

    text_threads_bench.py --tokref DIR --seconds S LABEL=BIN[:KEY=VAL,...] ...
"""
import argparse
import json
import multiprocessing
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time


def pct(xs, q):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


WORDS = None


def prose(nbytes, seed):
    global WORDS
    rng = random.Random(seed)
    if WORDS is None:
        letters = "etaoinshrdlucmfwypvbgkjqxz"
        WORDS = ["".join(random.Random(i).choice(letters) for _ in range(2 + i % 9))
                 for i in range(5000)]
    out, n = [], 0
    while n < nbytes:
        w = rng.choice(WORDS)
        if rng.random() < 0.1:
            w = w.capitalize() + rng.choice([".", ",", ";", "!"])
        out.append(w)
        n += len(w) + 1
    return " ".join(out)[:nbytes]


def request_bytes(method, path, obj=None):
    body = json.dumps(obj).encode() if obj is not None else b""
    head = "%s %s HTTP/1.1\r\nHost: b\r\n" % (method, path)
    if obj is not None:
        head += "Content-Type: application/json\r\nContent-Length: %d\r\n" % len(body)
    return (head + "\r\n").encode() + body


class Conn:
    def __init__(self, port, timeout=60):
        self.s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.f = self.s.makefile("rb")

    def ask(self, raw):
        self.s.sendall(raw)
        line = self.f.readline()
        status = int(line.split()[1])
        n = 0
        while True:
            h = self.f.readline()
            if h in (b"\r\n", b""):
                break
            if h.lower().startswith(b"content-length:"):
                n = int(h.split(b":")[1])
        self.f.read(n)
        return status

    def close(self):
        self.s.close()


class Daemon:
    def __init__(self, binary, tokref, extra):
        self.dir = tempfile.mkdtemp(prefix="kvr-bench-text.")
        http = {"listen": "127.0.0.1:0", "threads": "1"}
        tok = {"prefix_cache": "0"}
        for k, v in extra.items():
            sect, key = k.split(".", 1)
            (http if sect == "http" else tok)[key] = v
        lines = ["[log]", "level = info", "[events]", "bind = tcp://127.0.0.1:*", "[http]"]
        lines += ["%s = %s" % kv for kv in http.items()] + ["[tokenizer]"]
        lines += ["%s = %s" % kv for kv in tok.items()]
        for m in ("gemma3", "qwen3"):
            lines += ['[model "bench/%s"]' % m, "tokenizer = %s/%s" % (tokref, m)]
        conf = os.path.join(self.dir, "k.conf")
        with open(conf, "w") as f:
            f.write("\n".join(lines) + "\n")
        self.log = open(os.path.join(self.dir, "log"), "w+")
        self.p = subprocess.Popen([binary, "-c", conf], stderr=self.log, stdout=self.log)
        deadline = time.time() + 60
        while True:
            self.log.seek(0)
            m = re.search(r"kvrouterd ready.* http=[^ ]*:(\d+)", self.log.read())
            if m:
                self.port = int(m.group(1))
                break
            if self.p.poll() is not None or time.time() > deadline:
                self.log.seek(0)
                raise RuntimeError("daemon did not start: " + self.log.read()[-2000:])
            time.sleep(0.05)

    def stop(self):
        self.p.terminate()
        self.p.wait(timeout=30)


def probe(port, raw, stop, out):
    c = Conn(port)
    while not stop.is_set():
        t = time.perf_counter()
        st = c.ask(raw)
        out.append((time.perf_counter() - t) * 1000)
        assert st == 200, st
        time.sleep(0.01)
    c.close()


def load_main(port, kind, seconds, q):
    """Another process: the load. Puts (requests, statuses, latencies in ms)."""
    stop = time.time() + seconds
    lat, statuses, lock = [], {}, threading.Lock()

    def one(bodies):
        c = Conn(port, timeout=120)
        i = 0
        while time.time() < stop:
            t = time.perf_counter()
            st = c.ask(bodies[i % len(bodies)])
            with lock:
                lat.append((time.perf_counter() - t) * 1000)
                statuses[st] = statuses.get(st, 0) + 1
            i += 1
        c.close()

    if kind == "big":
        bodies = [request_bytes("POST", "/v1/score", {"model": "bench/gemma3",
                                                       "prompt": prose(1 << 20, 100 + k)})
                  for k in range(4)]
        threads = [threading.Thread(target=one, args=(bodies,))]
    else:  # chat: 64 connections, 32 KiB bodies
        bodies = []
        for k in range(16):
            msgs = [{"role": "system", "content": "You are a careful assistant %d." % k}]
            for t in range(6):
                msgs.append({"role": "user" if t % 2 == 0 else "assistant",
                             "content": prose(5400, 1000 * k + t)})
            bodies.append(request_bytes("POST", "/v1/score", {"model": "bench/qwen3",
                                                               "messages": msgs}))
        threads = [threading.Thread(target=one, args=(bodies[k % 16:] + bodies[:k % 16],))
                   for k in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    q.put((len(lat), statuses, lat))


def probes_under(d, kind, seconds):
    stop = threading.Event()
    hz, sc = [], []
    score = request_bytes("POST", "/v1/score", {"model": "bench/gemma3",
                                                 "token_ids": list(range(64))})
    ths = [threading.Thread(target=probe, args=(d.port, request_bytes("GET", "/healthz"),
                                                 stop, hz)),
           threading.Thread(target=probe, args=(d.port, score, stop, sc))]
    load = None
    q = multiprocessing.Queue()
    if kind != "idle":
        load = multiprocessing.Process(target=load_main, args=(d.port, kind, seconds, q))
        load.start()
        time.sleep(0.5)  # the load is running (bodies built) before probes count
    for t in ths:
        t.start()
    time.sleep(seconds if kind == "idle" else max(1.0, seconds - 0.5))
    stop.set()
    for t in ths:
        t.join()
    res = {"healthz": hz, "score": sc}
    if load is not None:
        n, statuses, lat = q.get(timeout=300)
        load.join()
        res["load"] = lat
        res["load_statuses"] = statuses
    return res


def sequential(d, raw, n):
    c = Conn(d.port, timeout=120)
    lat = []
    for _ in range(n):
        t = time.perf_counter()
        st = c.ask(raw)
        lat.append((time.perf_counter() - t) * 1000)
    c.close()
    return lat, st


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokref", required=True)
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("bins", nargs="+", help="LABEL=BIN[:section.key=val,...]")
    a = ap.parse_args()
    targets = []
    for spec in a.bins:
        label, rest = spec.split("=", 1)
        binary, _, opts = rest.partition(":")
        extra = dict(o.split("=", 1) for o in opts.split(",") if o)
        targets.append((label, binary, extra))
    rows = []

    def row(label, scen, what, xs, note=""):
        rows.append((label, scen, what, len(xs), statistics.median(xs) if xs else float("nan"),
                     pct(xs, 0.99), note))
        print("%-14s %-8s %-26s n=%5d  p50 %9.2f ms  p99 %9.2f ms %s" % rows[-1], flush=True)

    for label, binary, extra in targets:
        for kind in ("idle", "big", "chat"):
            ex = dict(extra)
            if kind == "big":
                ex["http.max_query_tokens"] = "1048576"
            d = Daemon(binary, a.tokref, ex)
            try:
                r = probes_under(d, kind, a.seconds)
            finally:
                d.stop()
            row(label, kind, "GET /healthz", r["healthz"])
            row(label, kind, "small /v1/score", r["score"])
            if "load" in r:
                row(label, kind, "load request", r["load"], str(r["load_statuses"]))
        # hand-off cost and where it pays; refusal time
        modes = [("", extra)]
        if extra.get("tokenizer.threads", "0") != "0": # a binary with text threads
            modes.append((" all off-loop", dict(extra, **{"tokenizer.offload_bytes": "0"})))
        for suffix, ex in modes:
            d = Daemon(binary, a.tokref, ex)
            try:
                for kb in (2, 8, 16, 32, 64):
                    raw = request_bytes("POST", "/v1/score", {"model": "bench/qwen3",
                                                               "prompt": prose(kb << 10, 7 + kb)})
                    lat, st = sequential(d, raw, 300 if kb <= 16 else 100)
                    row(label + suffix, "handoff", "%d KiB prompt" % kb, lat[20:], "status %d" % st)
            finally:
                d.stop()
        d = Daemon(binary, a.tokref, extra)
        try:
            for m in ("gemma3", "qwen3"):
                raw = request_bytes("POST", "/v1/score", {"model": "bench/" + m,
                                                           "prompt": prose(1 << 20, 55)})
                lat, st = sequential(d, raw, 10)
                row(label, "refuse", "1 MiB %s > 262144 tok" % m, lat, "status %d" % st)
        finally:
            d.stop()
    print()
    print("| binary | scenario | what | n | p50 ms | p99 ms | note |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print("| %s | %s | %s | %d | %.2f | %.2f | %s |" % r)


if __name__ == "__main__":
    main()
