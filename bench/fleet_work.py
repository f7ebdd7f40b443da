"""fleet_work — the workloads of bench/fleet_sim.py: prompts as shared token segments.

Why segments: a Mooncake window holds ~10^7 prompt tokens, most of them shared prefixes.
A prompt is a list of (segment, used length); a segment's token ids (array('I')), its JSON
text and the chain hashes of its blocks after a given parent are computed once and shared
by every prompt that contains it, so prompts cost memory and CPU in proportion to their
distinct content only.

Workloads (each returns a list of fleet_engine.Req sorted by arrival, in simulated s):
* mooncake: the Mooncake trace's timestamps and hash_ids; each 512-token hash id expands
  deterministically into 512 token ids (the last block truncated to input_length); a window
  [start, start + duration x rate) of trace time replayed `rate` times faster.
* hot: Poisson arrivals at `rate` req/s; a share (0.7) of the requests is one 4,096-token
  system prompt + a short unique suffix, the rest unique prompts of the same length.
* burst: every ~interval / rate s (uniform +-1/6), `size` (16) sibling requests sharing a
  new 6,144-token prefix + a short unique suffix each, arriving within 20 ms.
"""

import array
import hashlib
import json
import random

from fleet_engine import NONE_HASH, Req

VOCAB = 150000


class Segment:
    __slots__ = ("key", "arr", "_json")

    def __init__(self, key, n):
        self.key = key
        raw = hashlib.shake_128(key.encode()).digest(4 * n)
        a = array.array("I")
        a.frombytes(raw)
        self.arr = array.array("I", (x % VOCAB for x in a))
        self._json = None

    def json(self):
        if self._json is None:
            self._json = ",".join(map(str, self.arr))
        return self._json


class Corpus:
    """Shared segments and chain-hash memo for one workload."""

    def __init__(self, block_size=16):
        self.bs = block_size
        self.segs = {}
        self.memo = {}

    def seg(self, key, n):
        s = self.segs.get(key)
        if s is None or len(s.arr) < n:
            s = Segment(key, n)
            self.segs[key] = s
        return s

    def chain(self, parent, seg, used):
        """Digests of the full blocks of seg.arr[:used] chained from parent."""
        k = (parent, seg.key, used // self.bs)
        out = self.memo.get(k)
        if out is None:
            bs = self.bs
            out = []
            p = parent
            arr = seg.arr
            for i in range(used // bs):
                h = hashlib.sha256(p if p is not None else NONE_HASH)
                h.update(arr[i * bs:(i + 1) * bs].tobytes())
                p = h.digest()
                out.append(p)
            self.memo[k] = out
        return out

    def prompt(self, parts):
        """parts: [(key, seg_len, used_len)]; every part but the last must be whole blocks."""
        return Prompt(self, [(self.seg(k, n), u) for k, n, u in parts])


class Prompt:
    __slots__ = ("parts", "length", "hashes")

    def __init__(self, corpus, parts):
        self.parts = parts
        self.length = sum(u for _, u in parts)
        hashes = []
        parent = None
        bs = corpus.bs
        for i, (s, u) in enumerate(parts):
            if i < len(parts) - 1 and u % bs:
                raise ValueError("segment %s: %d tokens is not whole blocks" % (s.key, u))
            hs = corpus.chain(parent, s, u)
            hashes.extend(hs)
            if hs:
                parent = hs[-1]
        self.hashes = hashes

    def tokens(self, a, b):
        out = []
        pos = 0
        for s, u in self.parts:
            if pos >= b:
                break
            end = pos + u
            if end > a:
                lo = max(a, pos) - pos
                hi = min(b, end) - pos
                out.extend(s.arr[lo:hi])
            pos = end
        return out

    def json_ids(self):
        """The token ids as JSON array contents (no brackets)."""
        chunks = []
        for s, u in self.parts:
            if u == len(s.arr):
                chunks.append(s.json())
            else:
                chunks.append(",".join(map(str, s.arr[:u])))
        return ",".join(c for c in chunks if c)


def _mk(reqs):
    reqs.sort(key=lambda r: (r.arrival, r.rid))
    for i, r in enumerate(reqs):
        r.rid = i
        r.chain = list(r.prompt.hashes)
    return reqs


def mooncake(path, rate=1.0, duration=60.0, start=0.0, max_tokens=131072, seed=0, corpus=None):
    """Returns (reqs, info)."""
    corpus = corpus or Corpus()
    reqs = []
    skipped = 0
    t_lo = start * 1000.0
    t_hi = (start + duration * rate) * 1000.0
    with open(path) as f:
        for line in f:
            rec = json.loads(line)
            ts = rec["timestamp"]
            if ts < t_lo:
                continue
            if ts >= t_hi:
                break
            n_in, n_out = rec["input_length"], rec["output_length"]
            if n_in + n_out > max_tokens:
                skipped += 1
                continue
            parts = []
            left = n_in
            for h in rec["hash_ids"]:
                if left <= 0:
                    break
                used = min(512, left)
                parts.append(("m%d" % h, 512, used))
                left -= used
            if left > 0:  # input_length beyond its hash ids: unique filler
                parts.append(("mx%d" % ts, left, left))
            r = Req(0, (ts - t_lo) / 1000.0 / rate, corpus.prompt(parts), n_out, "trace")
            r.session = tuple(rec["hash_ids"])  # replaced by conversations() below
            reqs.append(r)
    reqs = _mk(reqs)
    conversations(reqs)
    return reqs, {"skipped_too_long": skipped, "corpus_segments": len(corpus.segs)}


def conversations(reqs):
    """The trace has no session ids: a request whose 512-token ids start with all of an
    earlier request's ids but its last (a partial block, whose id changes when the next
    turn fills it) is that conversation's next turn (the history is resent), the latest such
    request its previous turn (longest match first). Requests that only share a system
    prompt that some earlier one consisted of are taken as one conversation too: the trace
    cannot tell them apart. Sets req.session (the first turn's rid, as a string) and
    req.parent."""
    last = {}  # ids but the last of a request -> the latest such request
    for r in reqs:
        ids = r.session
        parent = None
        for k in range(len(ids), 0, -1):  # longest earlier prefix first
            parent = last.get(ids[:k])
            if parent is not None:
                break
        r.parent = parent
        if len(ids) >= 2:
            last[ids[:-1]] = r
    for r in reqs:
        r.session = r.parent.session if r.parent is not None else "conv-%d" % r.rid


def hot(rate, duration=60.0, seed=0, share=0.7, sys_len=4096, suffix=(32, 512),
        out=(32, 256), corpus=None):
    corpus = corpus or Corpus()
    rng = random.Random(seed)
    reqs = []
    t = rng.expovariate(rate)
    i = 0
    while t < duration:
        suf = rng.randint(*suffix)
        if rng.random() < share:
            parts = [("hot-sys", sys_len, sys_len), ("hs%d-%d" % (seed, i), suf, suf)]
            tag = "hot"
        else:
            n = sys_len + suf
            parts = [("hu%d-%d" % (seed, i), n, n)]
            tag = "unique"
        reqs.append(Req(0, t, corpus.prompt(parts), rng.randint(*out), tag))
        i += 1
        t += rng.expovariate(rate)
    return _mk(reqs), {"share": share, "sys_len": sys_len}


def burst(rate, duration=60.0, seed=0, size=16, prefix=6144, spread=0.02, interval=0.3,
          suffix=(64, 512), out=(32, 256), corpus=None):
    """rate: bursts per `interval` (1.0 = one burst every ~0.3 s)."""
    corpus = corpus or Corpus()
    rng = random.Random(seed)
    reqs = []
    gap = interval / rate
    t = rng.uniform(0, gap)
    b = 0
    while t < duration:
        for j in range(size):
            suf = rng.randint(*suffix)
            parts = [("bp%d-%d" % (seed, b), prefix, prefix), ("bs%d-%d-%d" % (seed, b, j), suf, suf)]
            reqs.append(Req(0, t + rng.uniform(0, spread), corpus.prompt(parts),
                            rng.randint(*out), "burst"))
        b += 1
        t += gap * rng.uniform(5 / 6.0, 7 / 6.0)
    return _mk(reqs), {"size": size, "prefix": prefix, "bursts": b}


WORKLOADS = ("mooncake", "hot", "burst")


def build(name, rate, duration, seed=0, trace=None, start=0.0, max_tokens=131072, corpus=None):
    if name == "mooncake":
        return mooncake(trace, rate=rate, duration=duration, start=start, max_tokens=max_tokens,
                        corpus=corpus)
    if name == "hot":
        return hot(rate, duration=duration, seed=seed, corpus=corpus)
    if name == "burst":
        return burst(rate, duration=duration, seed=seed, corpus=corpus)
    raise ValueError("unknown workload %r (mooncake, hot, burst)" % name)
