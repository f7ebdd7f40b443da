"""vllm_pub — a Python stand-in for vLLM engines publishing KV-cache events over ZeroMQ.

It follows ../shared/specs/vllm-kv-events.md (vLLM's ZmqEventPublisher and BlockPool):

* one PUB socket per DP rank, 3-frame messages [topic, be64 seq, msgpack batch], the same
  topic for every rank, seq counting from 0 per rank and per engine start;
* PUB either binds (our daemon connects to it: `mode="bind"`) or connects to the daemon's
  bound SUB (`mode="connect"`); the socket is an XPUB so a test can wait until a subscriber
  is really attached (wait_subscriber) instead of sleeping; on the wire it is a PUB;
* an optional replay ROUTER per rank serving a ring buffer of the last `buffer_steps`
  batches, replying in the v0.24 (`[id, "", seq, payload]`) or v0.25 (`[id, "", topic, seq,
  payload]`) format, then the end marker; bound on a free loopback port, or, with
  `replay_bind="tcp://H:P"`, on vLLM's per-rank address tcp://H:(P+rank);
* batch `[ts, events, dp_rank]`; events as v0.24+ tagged maps (`encoding="map"`) or v0.22
  tagged arrays (`encoding="array"`);
* block hashes as uint64 (`hash_mode="int"`, vLLM's default: last 8 bytes of the digest) or
  as 32-byte sha256 digests (`hash_mode="bytes"`);
* a prefix-cache model per rank: prompts are cut into full blocks of `block_size` tokens,
  each block's hash chains on its parent's (LoRA name as extra key), cached blocks are
  reused, new ones are taken from an LRU free queue (lazy eviction: reusing a cached free
  block emits BlockRemoved for it), finished requests free their blocks tail first;
* loss and restarts: `drop` a seq (kept in the replay ring, never sent live), `restart()`
  (seq back to 0, cache and ring emptied, no AllBlocksCleared, as vLLM does);
  `replay_end_gate` holds a replay's end marker back until a test opens it.

Usage:
    eng = Engine(pod="pod-a", model="m", mode="connect", endpoints=[daemon.events[0]])
    eng.wait_subscriber()
    r0 = eng.rank(0)
    r0.request(list(range(64)))      # queues BlockStored/BlockRemoved events
    r0.publish()                     # one batch, returns its seq
    eng.close()
"""

import collections
import hashlib
import struct
import threading
import time

import msgpack
import zmq

END_SEQ = b"\xff" * 8


def be64(v):
    return struct.pack(">Q", v)


def offset_endpoint_port(endpoint, rank):
    """vLLM's per-DP-rank endpoint rewrite: tcp://H:P -> tcp://H:(P+rank)."""
    if rank == 0 or not endpoint.startswith("tcp://"):
        return endpoint
    host, port = endpoint.rsplit(":", 1)
    return "%s:%d" % (host, int(port) + rank)


class _Block:
    __slots__ = ("bid", "hash", "ref")

    def __init__(self, bid):
        self.bid = bid
        self.hash = None
        self.ref = 0


class PrefixCache:
    """vLLM BlockPool in miniature: cached hash -> block, LRU free queue, lazy eviction."""

    def __init__(self, num_blocks):
        self.blocks = [_Block(i) for i in range(num_blocks)]
        self.free = collections.OrderedDict((b.bid, b) for b in self.blocks)
        self.cached = {}

    def lookup(self, h):
        return self.cached.get(h)

    def touch(self, blk):
        if blk.ref == 0:
            self.free.pop(blk.bid, None)
        blk.ref += 1

    def allocate(self):
        """Pops the LRU free block; returns (block, evicted_hash_or_None)."""
        if not self.free:
            raise RuntimeError("prefix cache out of blocks")
        _, blk = self.free.popitem(last=False)
        evicted = None
        if blk.hash is not None:
            evicted = blk.hash
            del self.cached[blk.hash]
            blk.hash = None
        blk.ref = 1
        return blk, evicted

    def release(self, blocks):
        for blk in reversed(blocks):  # tail first: leaves are evicted before their parents
            blk.ref -= 1
            if blk.ref == 0:
                self.free[blk.bid] = blk

    def reset(self):
        self.__init__(len(self.blocks))


class Rank:
    """One DP rank of an engine: its own PUB, seq counter, replay ring and prefix cache."""

    def __init__(self, engine, rank, pub_endpoint):
        self.engine = engine
        self.rank = rank
        self.seq = 0
        self.drop = set()
        self.pending = []
        self.cache = PrefixCache(engine.num_blocks)
        self.ring = collections.deque(maxlen=engine.buffer_steps)
        self.ring_lock = threading.Lock()
        self.replay_requests = 0
        self.skip_replay = set()  # seqs the ROUTER pretends not to have
        # When set (a threading.Event), the ROUTER sends a replay's batches, sets
        # replay_served, and holds the end marker until the gate opens (at most 10 s): a test
        # can lose live batches after the engine served a replay, before its end arrives.
        self.replay_end_gate = None
        self.replay_served = threading.Event()
        # Seconds the ROUTER waits before each replayed batch (0 = none): a slow replay, so a
        # test can watch the recovery progress move.
        self.replay_delay = 0
        ctx = engine.ctx
        self.pub = ctx.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        # every subscription is reported, also one the XPUB already holds: a restarted
        # daemon's may arrive before the killed one's pipe is torn down, and would otherwise
        # be swallowed as a duplicate (wait_subscriber then timed out under load)
        self.pub.setsockopt(zmq.XPUB_VERBOSE, 1)
        self.pub.setsockopt(zmq.SNDHWM, engine.hwm)
        self.pub.setsockopt(zmq.RCVHWM, engine.hwm)
        for opt, val in engine.pub_options.items():  # e.g. CURVE client keys
            self.pub.setsockopt(opt, val)
        if engine.mode == "bind":
            self.pub.bind(pub_endpoint)
        else:
            self.pub.connect(pub_endpoint)
        self.pub_endpoint = self.pub.getsockopt_string(zmq.LAST_ENDPOINT) or pub_endpoint
        self.replay_endpoint = None
        self._stop = threading.Event()
        self._thread = None
        if engine.replay:
            ready = threading.Event()
            self._thread = threading.Thread(target=self._serve_replay, args=(ready,), daemon=True)
            self._thread.start()
            if not ready.wait(10):
                raise RuntimeError("replay ROUTER did not start")

    # ---- hashing ------------------------------------------------------------------------
    def block_hash(self, parent, tokens, lora_name):
        h = hashlib.sha256()
        h.update(parent if parent is not None else self.engine.none_hash)
        h.update(struct.pack("<%dI" % len(tokens), *tokens))
        if lora_name:
            h.update(b"\x00lora\x00" + lora_name.encode())
        return h.digest()

    def wire_hash(self, digest):
        if self.engine.hash_mode == "bytes":
            return digest
        return int.from_bytes(digest[-8:], "big")

    # ---- events -------------------------------------------------------------------------
    def _stored(self, hashes, parent, tokens, lora_name, medium, lora_id=None, block_size=None):
        bs = self.engine.block_size if block_size is None else block_size
        w = [self.wire_hash(h) for h in hashes]
        p = self.wire_hash(parent) if parent is not None else None
        if self.engine.encoding == "array":
            return ["BlockStored", w, p, list(tokens), bs, lora_id, medium, lora_name,
                    [None] * len(w), 0, "full_attention", None]
        ev = {"type": "BlockStored", "block_hashes": w, "parent_block_hash": p,
              "token_ids": list(tokens), "block_size": bs, "lora_id": lora_id,
              "medium": medium, "lora_name": lora_name, "extra_keys": [None] * len(w),
              "group_idx": 0, "kv_cache_spec_kind": "full_attention"}
        return ev

    def _removed(self, hashes, medium):
        w = [self.wire_hash(h) for h in hashes]
        if self.engine.encoding == "array":
            return ["BlockRemoved", w, medium, 0]
        return {"type": "BlockRemoved", "block_hashes": w, "medium": medium, "group_idx": 0}

    def _cleared(self):
        if self.engine.encoding == "array":
            return ["AllBlocksCleared"]
        return {"type": "AllBlocksCleared"}

    def chain(self, tokens, lora_name=None):
        """Engine hashes (digests) of the full blocks of a prompt."""
        bs = self.engine.block_size
        out, parent = [], None
        for i in range(len(tokens) // bs):
            parent = self.block_hash(parent, tokens[i * bs:(i + 1) * bs], lora_name)
            out.append(parent)
        return out

    def request(self, tokens, lora_name=None, medium=None, finish=True):
        """Runs one prompt through the prefix cache and queues the events vLLM would send.
        Returns (cached_blocks_hit, stored_hashes, removed_hashes)."""
        lora_name = lora_name if lora_name is not None else self.engine.lora_name
        medium = medium or self.engine.medium
        bs = self.engine.block_size
        hashes = self.chain(tokens, lora_name)
        held, hit = [], 0
        for h in hashes:
            blk = self.cache.lookup(h)
            if blk is None:
                break
            self.cache.touch(blk)
            held.append(blk)
            hit += 1
        stored, removed = [], []
        for i in range(hit, len(hashes)):
            blk, evicted = self.cache.allocate()
            if evicted is not None:
                removed.append(evicted)
                self.pending.append(self._removed([evicted], medium))
            blk.hash = hashes[i]
            self.cache.cached[hashes[i]] = blk
            held.append(blk)
            stored.append(hashes[i])
        if len(tokens) % bs:
            blk, evicted = self.cache.allocate()  # the partial tail block: never announced
            if evicted is not None:
                removed.append(evicted)
                self.pending.append(self._removed([evicted], medium))
            held.append(blk)
        if stored:
            parent = hashes[hit - 1] if hit > 0 else None
            toks = tokens[hit * bs:(hit + len(stored)) * bs]
            self.pending.append(self._stored(stored, parent, toks, lora_name, medium))
        if finish:
            self.cache.release(held)
        return hit, stored, removed

    def store(self, tokens, parent=None, lora_name=None, medium=None, lora_id=None,
              block_size=None):
        """Queues a raw BlockStored for the full blocks of tokens (chained from parent)."""
        bs = self.engine.block_size if block_size is None else block_size
        hashes, p = [], parent
        for i in range(len(tokens) // bs):
            p = self.block_hash(p, tokens[i * bs:(i + 1) * bs], lora_name)
            hashes.append(p)
        self.pending.append(self._stored(hashes, parent, tokens[:len(hashes) * bs], lora_name,
                                         medium or self.engine.medium, lora_id, block_size))
        return hashes

    def remove(self, hashes, medium=None):
        self.pending.append(self._removed(hashes, medium or self.engine.medium))

    def clear(self):
        self.cache.reset()
        self.pending.append(self._cleared())

    def raw_event(self, ev):
        self.pending.append(ev)

    # ---- publishing ---------------------------------------------------------------------
    def batch_payload(self, events):
        return msgpack.packb([time.time(), events, self.rank], use_bin_type=True)

    def publish(self, drop=False):
        """Sends the queued events as one batch (even when empty); returns its seq."""
        seq = self.seq
        self.seq += 1
        payload = self.batch_payload(self.pending)
        self.pending = []
        with self.ring_lock:
            self.ring.append((seq, payload))
        if not drop and seq not in self.drop:
            self.pub.send_multipart([self.engine.topic_bytes, be64(seq), payload])
        return seq

    def send_frames(self, frames):
        self.pub.send_multipart(frames)

    def restart(self):
        """Engine restart: seq back to 0, empty cache and ring, no AllBlocksCleared."""
        self.seq = 0
        self.pending = []
        self.cache.reset()
        with self.ring_lock:
            self.ring.clear()

    def wait_subscriber(self, timeout=10.0):
        """Waits for a subscription message on the XPUB (a subscriber is attached)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.pub.poll(100, zmq.POLLIN):
                msg = self.pub.recv()
                if msg[:1] == b"\x01":
                    return True
        raise TimeoutError("no subscriber on %s" % self.pub_endpoint)

    # ---- replay ROUTER --------------------------------------------------------------------
    def _serve_replay(self, ready):
        sock = self.engine.ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        rb = self.engine.replay_bind
        sock.bind(offset_endpoint_port(rb, self.rank) if rb else "tcp://127.0.0.1:*")
        self.replay_endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        ready.set()
        v25 = self.engine.replay_format == "v0.25"
        try:
            while not self._stop.is_set():
                if not sock.poll(50, zmq.POLLIN):
                    continue
                frames = sock.recv_multipart()
                if len(frames) != 3:
                    continue  # vLLM logs and does not answer
                ident, _, start = frames
                start_seq = int.from_bytes(start, "big")
                self.replay_requests += 1
                with self.ring_lock:
                    items = [(s, p) for s, p in self.ring
                             if s >= start_seq and s not in self.skip_replay]
                for s, p in items:
                    if self.replay_delay:
                        time.sleep(self.replay_delay)
                    if v25:
                        sock.send_multipart([ident, b"", self.engine.topic_bytes, be64(s), p])
                    else:
                        sock.send_multipart([ident, b"", be64(s), p])
                self.replay_served.set()
                gate = self.replay_end_gate
                if gate is not None:
                    gate.wait(10)
                if v25:
                    sock.send_multipart([ident, b"", b"", END_SEQ, b""])
                else:
                    sock.send_multipart([ident, b"", END_SEQ, b""])
        finally:
            sock.close(0)

    def close(self):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self.pub.close(0)


class Engine:
    """A vLLM engine (one pod, one model) with dp_size ranks."""

    def __init__(self, pod="pod-0", model="test/model", topic=None, dp_size=1, mode="connect",
                 endpoints=None, replay=False, replay_format="v0.25", encoding="map",
                 hash_mode="int", block_size=16, num_blocks=4096, lora_name=None, medium="GPU",
                 buffer_steps=10000, hwm=100000, hash_seed="0", ctx=None, pub_options=None,
                 replay_bind=None):
        assert mode in ("bind", "connect")
        assert replay_format in ("v0.24", "v0.25")
        assert encoding in ("map", "array")
        assert hash_mode in ("int", "bytes")
        self.pod, self.model = pod, model
        self.topic = topic if topic is not None else "kv@%s@%s" % (pod, model)
        self.topic_bytes = self.topic.encode()
        self.mode = mode
        self.replay, self.replay_format = replay, replay_format
        self.replay_bind = replay_bind  # "tcp://H:P": rank r's ROUTER binds H:(P+r), as vLLM
        self.encoding, self.hash_mode = encoding, hash_mode
        self.block_size, self.num_blocks = block_size, num_blocks
        self.lora_name, self.medium = lora_name, medium
        self.buffer_steps, self.hwm = buffer_steps, hwm
        self.pub_options = dict(pub_options or {})  # {zmq option: value} set before connect
        self.none_hash = hashlib.sha256(hash_seed.encode()).digest()
        self.ctx = ctx or zmq.Context.instance()
        self.ranks = []
        for r in range(dp_size):
            if mode == "bind":
                ep = "tcp://127.0.0.1:*"
            else:
                if not endpoints:
                    raise ValueError("connect mode needs the daemon's SUB endpoint(s)")
                # One endpoint per rank, or vLLM's port offset from the first one.
                ep = endpoints[r] if r < len(endpoints) else offset_endpoint_port(endpoints[0], r)
            self.ranks.append(Rank(self, r, ep))

    def rank(self, r=0):
        return self.ranks[r]

    @property
    def pub_endpoints(self):
        return [r.pub_endpoint for r in self.ranks]

    @property
    def replay_endpoints(self):
        return [r.replay_endpoint for r in self.ranks]

    def wait_subscriber(self, timeout=10.0):
        for r in self.ranks:
            r.wait_subscriber(timeout)

    def close(self):
        for r in self.ranks:
            r.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def tokens_for(seed, n, vocab=150000):
    """Deterministic pseudo-random token ids (a prompt)."""
    out, x = [], (seed * 2654435761 + 12345) & 0xFFFFFFFF
    for _ in range(n):
        x = (x * 1103515245 + 12345) & 0x7FFFFFFF
        out.append(x % vocab)
    return out
