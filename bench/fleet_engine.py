"""fleet_engine — one simulated vLLM engine for bench/fleet_sim.py.

Why: routing quality is decided by what happens inside the engines (queues, chunked
prefill, prefix-cache hits, KV blocks running out), so the fleet simulator needs engines
that behave like vLLM's V1 scheduler in time, publish vLLM's real KV events, and export
vLLM's /metrics, while costing little CPU (one Python thread drives eight of them).

The model (every constant is an argument; defaults in EngineConfig):
* Continuous batching with chunked prefill, vLLM V1's order: the running requests first
  (a decoding one takes 1 token of the step's budget, a prefilling one its next chunk),
  then the waiting ones in arrival order while budget, KV blocks and max_num_seqs last.
  A request that finds too few free blocks to be admitted waits (counted once per request
  as a KV wait); a running one that cannot grow preempts the latest running request
  (recompute: its blocks are freed, it goes back to the head of the queue; counted).
* Step time = step_fixed + per_prefill_token x prefill tokens + per_decode_seq x decoding
  requests of the step. The first token is sampled by the step that completes the prompt;
  each decode step samples one more.
* Prefix cache = vLLM's BlockPool (vllm_pub.PrefixCache: hash -> block, LRU free queue,
  lazy eviction): at admission the longest cached chain of the prompt's block hashes is
  reused (at most (tokens-1)//block_size blocks, as vLLM recomputes the last token); a
  block gets its hash when the step that computes it ends (prompt and output blocks
  alike), which is when BlockStored is published; reusing an evicted cached block
  publishes BlockRemoved. A block computed twice (two requests prefilling the same prefix
  at once) is deduplicated onto the cached copy, so every parent of a stored block is
  held by a live request. Finished requests free their blocks tail first.
* Events go out as vLLM's ZmqEventPublisher does (vllm_pub.Rank: 3 frames, msgpack batch,
  uint64 block hashes), one batch per step that has events.
* GET /metrics answers Prometheus text with vLLM's names and labels.
"""

import array
import collections
import hashlib
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))

from vllm_pub import PrefixCache  # noqa: E402

NONE_HASH = hashlib.sha256(b"0").digest()  # vllm_pub's none_hash for hash_seed "0"


class EngineConfig:
    """Engine constants. Calibration (defaults): a step that fills the 2,048-token budget
    with prefill takes 7 ms + 2048 x 42 us = 93 ms, i.e. ~22K prefill tokens/s; a decode
    step of 50 sequences takes 7 + 50 x 0.06 = 10 ms."""

    def __init__(self, budget=2048, step_fixed=0.007, per_prefill_token=42e-6,
                 per_decode_seq=60e-6, num_blocks=32768, block_size=16, max_num_seqs=256):
        self.budget = budget
        self.step_fixed = step_fixed
        self.per_prefill_token = per_prefill_token
        self.per_decode_seq = per_decode_seq
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.max_num_seqs = max_num_seqs

    def prefill_rate(self):
        """Prefill tokens/s of steps filled with prefill."""
        return self.budget / (self.step_fixed + self.budget * self.per_prefill_token)

    def as_dict(self):
        return dict(self.__dict__)


def block_hash(parent, token_bytes):
    """vllm_pub's chain hash (sha256 of parent digest + little-endian u32 tokens)."""
    h = hashlib.sha256(parent if parent is not None else NONE_HASH)
    h.update(token_bytes)
    return h.digest()


def out_token(rid, j):
    """The j-th generated token of request rid (deterministic)."""
    return (rid * 1000003 + j * 7919 + 12345) % 150000


class Req:
    """One request: the workload's part (prompt, lengths, arrival) and the state of its
    life in the router and the engine."""

    __slots__ = ("rid", "arrival", "prompt", "plen", "olen", "tag", "session", "parent",
                 "pd", "kv_in",
                 # router side
                 "engine", "routed_t", "route_ms", "kvr", "rstate",
                 # engine side
                 "chain", "blocks", "computed", "pt", "out_done", "n_hashed", "hit_tokens",
                 "first_t", "done_t", "waited", "preempted", "admitted")

    def __init__(self, rid, arrival, prompt, olen, tag=""):
        self.rid = rid
        self.arrival = arrival
        self.prompt = prompt
        self.plen = prompt.length
        self.olen = max(1, olen)
        self.tag = tag
        self.pd = None       # disaggregated: on a prefill copy, (the request, decode engine)
        self.kv_in = False   # disaggregated: its prompt's KV came from a prefill engine
        self.session = None  # a conversation's key (mooncake: its first turn's rid)
        self.parent = None   # the conversation's previous turn (a Req), if any
        self.engine = None
        self.routed_t = None
        self.route_ms = 0.0
        self.kvr = None
        self.rstate = None
        self.chain = None
        self.blocks = []
        self.computed = 0
        self.pt = 0
        self.out_done = 0
        self.n_hashed = 0
        self.hit_tokens = None
        self.first_t = None
        self.done_t = None
        self.waited = False
        self.preempted = 0
        self.admitted = False

    def tokens(self, a, b):
        """Token ids at positions [a, b) of prompt + generated output."""
        plen = self.plen
        if b <= plen:
            return self.prompt.tokens(a, b)
        out = self.prompt.tokens(a, plen) if a < plen else []
        rid = self.rid
        out.extend(out_token(rid, j - plen) for j in range(max(a, plen), b))
        return out


class SimEngine:
    """One engine. `publisher` is a vllm_pub.Rank (or None: no events, e.g. calibration).
    Driven by the fleet loop: add(req, t), start_step(t) -> duration or None,
    end_step(t) -> (first-token requests, finished requests)."""

    def __init__(self, idx, cfg, publisher=None, pod=None, model="fleet/model"):
        self.idx = idx
        self.cfg = cfg
        self.pub = publisher
        self.pod = pod or ("engine-%d" % idx)
        self.model = model
        self.pool = PrefixCache(cfg.num_blocks)
        self.waiting = collections.deque()
        self.running = []
        self.sched = None  # the step in flight: list of (req, n tokens)
        self.step_end_t = None
        self.events = []
        self.lock = threading.Lock()  # for /metrics readers (values are read as a set)
        # counters (vLLM's names in /metrics)
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.prefix_queries = 0
        self.prefix_hits = 0
        # simulator statistics
        self.requests = 0
        self.kv_waits = 0        # requests that waited for free KV blocks (once each)
        self.preemptions = 0
        self.steps = 0
        self.busy_time = 0.0     # time spent in steps
        self.util_time = 0.0     # budget-weighted busy time (see fleet_sim: utilization)
        self.active_tokens = 0   # prompt + generated tokens of the requests in the engine
        self.kv_peak = 0.0
        self.window = None       # (t0, t1): generated tokens and utilization counted inside
        self.window_tokens = 0
        self.util_win = 0.0
        self.stored_blocks = 0
        self.removed_blocks = 0

    # ---- load as the engine itself knows it ---------------------------------------------
    def num_active(self):
        return len(self.waiting) + len(self.running)

    def kv_usage(self):
        return 1.0 - len(self.pool.free) / self.cfg.num_blocks

    def idle(self):
        return self.sched is None

    # ---- requests --------------------------------------------------------------------------
    def add(self, req):
        req.engine = self.idx
        self.waiting.append(req)
        self.requests += 1
        self.active_tokens += req.plen

    def _free_blocks(self, req):
        self.pool.release(req.blocks)  # tail first
        req.blocks = []

    def _preempt(self, victim):
        self.running.remove(victim)
        self._free_blocks(victim)
        victim.computed = 0
        victim.n_hashed = 0
        victim.admitted = False
        victim.preempted += 1
        victim.kv_in = False  # its transferred KV is gone: recomputed here
        self.preemptions += 1
        self.waiting.appendleft(victim)

    def _allocate(self, req, need):
        """Gives req `need` more blocks from the free queue (caller checked the count)."""
        pool = self.pool
        free = pool.free
        blocks = req.blocks
        for _ in range(need):
            _, blk = free.popitem(last=False)
            if blk.hash is not None:
                del pool.cached[blk.hash]
                self._removed(blk.hash)
                blk.hash = None
            blk.ref = 1
            blocks.append(blk)

    # ---- one step ---------------------------------------------------------------------------
    def start_step(self, t):
        """Schedules a step at time t; returns its duration, or None (nothing to do)."""
        cfg = self.cfg
        bs = cfg.block_size
        budget = cfg.budget
        pool = self.pool
        free = pool.free
        sched = []
        prefill = 0
        decode = 0
        preempted = False
        running = self.running
        i = 0
        while i < len(running) and budget > 0:
            r = running[i]
            if r.computed < r.pt:
                n = r.pt - r.computed
                if n > budget:
                    n = budget
            else:
                n = 1
            need = (r.computed + n + bs - 1) // bs - len(r.blocks)
            while need > len(free):
                victim = running[-1]
                self._preempt(victim)
                preempted = True
                if victim is r:
                    break
            if not r.admitted:  # r itself was preempted
                break
            if need > 0:
                self._allocate(r, need)
            sched.append((r, n))
            budget -= n
            if n == 1 and r.computed >= r.pt:
                decode += 1
            else:
                prefill += n
            i += 1
        if not preempted:
            waiting = self.waiting
            cached = pool.cached
            while waiting and budget > 0 and len(running) < cfg.max_num_seqs:
                r = waiting[0]
                pt = r.plen + r.out_done
                if r.kv_in:  # disaggregated: the prompt's KV arrived; compute its last token
                    need = (pt + bs - 1) // bs
                    if need > len(free):
                        if not r.waited:
                            r.waited = True
                            self.kv_waits += 1
                        break
                    waiting.popleft()
                    r.blocks = []
                    self._allocate(r, need)
                    r.computed = pt - 1
                    r.n_hashed = 0
                    r.pt = pt
                    r.admitted = True
                    running.append(r)
                    sched.append((r, 1))
                    budget -= 1
                    prefill += 1
                    continue
                chain = r.chain
                maxhit = (pt - 1) // bs
                hit = []
                while len(hit) < maxhit and len(hit) < len(chain):
                    b = cached.get(chain[len(hit)])
                    if b is None:
                        break
                    hit.append(b)
                h = len(hit)
                n = pt - h * bs
                if n > budget:
                    n = budget
                need = (h * bs + n + bs - 1) // bs - h
                avail = len(free) - sum(1 for b in hit if b.ref == 0)
                if need > avail:
                    if not r.waited:
                        r.waited = True
                        self.kv_waits += 1
                    break
                waiting.popleft()
                for b in hit:
                    pool.touch(b)
                r.blocks = hit
                r.computed = h * bs
                r.n_hashed = h
                r.pt = pt
                r.admitted = True
                if r.hit_tokens is None:
                    r.hit_tokens = h * bs
                self.prefix_queries += pt
                self.prefix_hits += h * bs
                self._allocate(r, need)
                running.append(r)
                sched.append((r, n))
                budget -= n
                prefill += n
        if not sched:
            self.sched = None
            return None
        self.sched = sched
        d = cfg.step_fixed + cfg.per_prefill_token * prefill + cfg.per_decode_seq * decode
        self.steps += 1
        self.busy_time += d
        u = (cfg.step_fixed * (prefill + decode) / cfg.budget
             + cfg.per_prefill_token * prefill + cfg.per_decode_seq * decode)
        self.util_time += u
        w = self.window
        if w is not None and w[0] <= t < w[1]:
            self.util_win += u
        self.step_end_t = t + d
        return d

    def end_step(self, t):
        """Applies the step that ends at t. Returns (first_token_reqs, finished_reqs)."""
        sched = self.sched
        self.sched = None
        firsts = []
        done = []
        sampled = 0
        bs = self.cfg.block_size
        for r, n in sched:
            r.computed += n
            if r.computed < r.pt:
                self._cache_blocks(r)
                continue
            # the prompt (or the re-prefill after a preemption) is complete, or a decode step
            r.out_done += 1
            sampled += 1
            self.active_tokens += 1
            if r.first_t is None:
                r.first_t = t
                self.prompt_tokens += r.plen
                firsts.append(r)
            if r.computed // bs > r.n_hashed:
                self._cache_blocks(r)
            if r.out_done >= r.olen:
                r.done_t = t
                self.running.remove(r)
                self._free_blocks(r)
                r.admitted = False
                self.active_tokens -= r.plen + r.out_done
                done.append(r)
        self.generation_tokens += sampled
        w = self.window
        if w is not None and w[0] <= t < w[1]:
            self.window_tokens += sampled
        u = self.kv_usage()
        if u > self.kv_peak:
            self.kv_peak = u
        if self.events and self.pub is not None:
            self.pub.pending = self.events
            self.pub.publish()
        self.events = []
        return firsts, done

    # ---- block hashes and events ----------------------------------------------------------
    def _cache_blocks(self, r):
        """Gives the blocks r completed their hashes (BlockStored), deduplicating a block
        whose hash another block already holds onto that block."""
        bs = self.cfg.block_size
        full = r.computed // bs
        k = r.n_hashed
        if full <= k:
            return
        chain = r.chain
        pool = self.pool
        cached = pool.cached
        blocks = r.blocks
        group = []
        gstart = k
        while k < full:
            if k < len(chain):
                h = chain[k]
            else:  # an output block (or one straddling the prompt's end): hash it now
                parent = chain[k - 1] if k > 0 else None
                toks = r.tokens(k * bs, (k + 1) * bs)
                h = block_hash(parent, _pack(toks))
                chain.append(h)
            blk = blocks[k]
            if blk.hash is None:
                other = cached.get(h)
                if other is None:
                    blk.hash = h
                    cached[h] = blk
                    if not group:
                        gstart = k
                    group.append(h)
                else:
                    # computed twice: keep the cached copy, free this one
                    pool.touch(other)
                    blocks[k] = other
                    blk.ref -= 1
                    if blk.ref == 0:
                        pool.free[blk.bid] = blk
                        pool.free.move_to_end(blk.bid, last=False)
                    if group:
                        self._stored(r, gstart, group)
                        group = []
            k += 1
        if group:
            self._stored(r, gstart, group)
        r.n_hashed = full

    def _stored(self, r, start, hashes):
        self.stored_blocks += len(hashes)
        if self.pub is None:
            return
        bs = self.cfg.block_size
        parent = r.chain[start - 1] if start > 0 else None
        toks = r.tokens(start * bs, (start + len(hashes)) * bs)
        self.events.append(self.pub._stored(hashes, parent, toks, None, "GPU"))

    def _removed(self, h):
        self.removed_blocks += 1
        if self.pub is None:
            return
        self.events.append(self.pub._removed([h], "GPU"))

    def flush_events(self):
        if self.events and self.pub is not None:
            self.pub.pending = self.events
            self.pub.publish()
        self.events = []

    # ---- what validation compares -------------------------------------------------------------
    def cached_prefix_blocks(self, chain):
        """Leading blocks of a prompt's hash chain held in this engine's prefix cache."""
        cached = self.pool.cached
        n = 0
        for h in chain:
            if h not in cached:
                break
            n += 1
        return n

    # ---- /metrics --------------------------------------------------------------------------------
    def metrics_text(self):
        lab = '{engine="0",model_name="%s"}' % self.model
        with self.lock:
            vals = (len(self.waiting), len(self.running), self.kv_usage(), self.prompt_tokens,
                    self.generation_tokens, self.prefix_queries, self.prefix_hits,
                    self.preemptions)
        w, r, u, pt, gt, pq, ph, pre = vals
        out = []

        def metric(name, kind, help_, value, labels=lab):
            out.append("# HELP %s %s\n# TYPE %s %s\n%s%s %s\n"
                       % (name, help_, name, kind, name, labels, repr(float(value))))

        metric("vllm:num_requests_running", "gauge",
               "Number of requests in model execution batches.", r)
        metric("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", w)
        metric("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", u)
        metric("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", pt)
        metric("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.", gt)
        metric("vllm:prefix_cache_queries_total", "counter",
               "Prefix cache queries, in terms of number of queried tokens.", pq)
        metric("vllm:prefix_cache_hits_total", "counter",
               "Prefix cache hits, in terms of number of cached tokens.", ph)
        metric("vllm:num_preemptions_total", "counter", "Cumulative number of preemption from the engine.", pre)
        out.append('# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n'
                   '# TYPE vllm:cache_config_info gauge\n'
                   'vllm:cache_config_info{block_size="%d",enable_prefix_caching="True",'
                   'engine="0",num_gpu_blocks="%d"} 1.0\n'
                   % (self.cfg.block_size, self.cfg.num_blocks))
        return "".join(out)


def _pack(toks):
    return array.array("I", toks).tobytes()


class _MetricsHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    wbufsize = 1 << 16
    disable_nagle_algorithm = True

    def log_message(self, *a):
        pass

    def do_GET(self):
        eng = self.server.engine
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            body = eng.metrics_text().encode()
            ctype = "text/plain; version=0.0.4; charset=utf-8"
            status = 200
        elif path in ("/health", "/v1/models"):
            body = b'{"object":"list","data":[{"id":"%s"}]}' % eng.model.encode()
            ctype = "application/json"
            status = 200
        else:
            body = b'{"error":"not found"}'
            ctype = "application/json"
            status = 404
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class MetricsServer(ThreadingHTTPServer):
    """The engine's HTTP face: GET /metrics (and /health). Bound before the engine's
    publisher exists, because the pod id is 127.0.0.1:<this port>."""
    daemon_threads = True
    request_queue_size = 64

    def __init__(self, port=0):
        super().__init__(("127.0.0.1", port), _MetricsHandler)
        self.engine = None
        self.port = self.server_address[1]
        self.thread = None
        self.scrapes = 0

    def start(self, engine):
        self.engine = engine
        self.thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.2},
                                       daemon=True)
        self.thread.start()

    def handle_error(self, request, client_address):
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionResetError, BrokenPipeError)):
            return
        super().handle_error(request, client_address)

    def stop(self):
        if self.thread is not None:
            self.shutdown()
        self.server_close()
