"""fleet_routers — the routing policies bench/fleet_sim.py compares.

Each router sees only what the real system it stands for sees:
* round-robin: nothing.
* least-loaded: its own in-flight prompt tokens per engine (+ at routing, - at completion).
* kvrouterd-gw: kvrouterd's POST /v1/route exactly as deploy/nginx/kvrouter.js and
  deploy/haproxy/kvrouter.lua call it: the request body (here token_ids, as a gateway
  that has them would send; the shipped ones send the text, kvrouterd tokenizes it) with
  the engines as candidates ({"pod"} only: no loads), no policy (the daemon's default),
  no track.
* kvrouterd-cost-true / kvrouterd-cache_aware-true: /v1/route with that policy and each
  candidate's true load given by the gateway (active_requests = the engine's running +
  waiting requests, active_tokens = their prompt + generated tokens, read from the
  simulated engines at decision time: a gateway that knows its engines exactly).
* kvrouterd:<policy>: /v1/route with that policy name and no loads (a new policy can be
  measured without code change; "kvrouterd:" + "" = the daemon's default, like -gw).
  llm-d:<seconds> is llm-d with that stickiness bound.
* sglang: SGLang gateway's cache_aware over kvrouterd's exact overlaps (/v1/score) and
  its own in-flight request counts: least loaded when max - min > 64 and max > 1.5 min,
  else the best match if its match rate >= 0.3, else least loaded.
* dynamo: Dynamo's KV router cost, overlap weight 1: (its tracked prefill tokens of the
  engine + this request's uncached tokens) / block size + the engine's active blocks
  (distinct blocks of the requests it routed there and that have not finished, this
  request's included); prefill tokens are tracked until the first token comes back.
* llm-d: the prefix-cache affinity filter (keep engines whose prefix score - matched /
  query blocks - is >= 0.80, unless the sticky set's predicted TTFT, its least in-flight
  tokens / 15,928 tok/s, exceeds the other engines' by more than `llmd_ttft_bound` s),
  then the token-load scorer 1 - min(1, in-flight tokens / 4 Mi) (the highest wins);
  in-flight tokens = its own routed prompt tokens until completion.

route(req, kvr) runs on a routing thread (kvr: that thread's kvrouterd client, or None);
on_first_token(req) and on_done(req) run on the simulation thread. Decisions and the
bookkeeping they read are under one lock per router, as in a real single-process gateway.
Ties go to a seeded random choice.
"""

import json
import random
import threading


class Ctx:
    """What a router may be given: the engines' pods (candidate order), the model, the block
    size, the engines themselves (only the -true routers read them), options."""

    def __init__(self, pods, model, block_size, engines, seed=1, llmd_ttft_bound=1.0):
        self.pods = pods
        self.pd_prefill = 0  # disaggregated fleets: the first pd_prefill engines prefill
        self.index = {p: i for i, p in enumerate(pods)}
        self.model = model
        self.block_size = block_size
        self.engines = engines
        self.seed = seed
        self.llmd_ttft_bound = llmd_ttft_bound


class Router:
    needs_kvr = False
    name = "?"

    def __init__(self, ctx):
        self.ctx = ctx
        self.n = len(ctx.pods)
        self.lock = threading.Lock()
        self.rng = random.Random(ctx.seed)
        self.fallbacks = 0
        self.reasons = {}

    def route(self, req, kvr):
        raise NotImplementedError

    def on_first_token(self, req):
        pass

    def on_done(self, req):
        pass

    def argmin(self, vals, among=None):
        idx = range(len(vals)) if among is None else among
        best = min(vals[i] for i in idx)
        ties = [i for i in idx if vals[i] == best]
        return ties[0] if len(ties) == 1 else self.rng.choice(ties)

    # kvrouterd's exact overlaps, for the routers written in Python
    def overlaps(self, req, kvr):
        body = ('{"model":%s,"token_ids":[%s],"pods":%s}'
                % (json.dumps(self.ctx.model), req.prompt.json_ids(), json.dumps(self.ctx.pods)))
        status, ans = kvr.post("/v1/score", body)
        if status != 200:
            raise RuntimeError("/v1/score HTTP %d %r" % (status, ans))
        m = [0] * self.n
        for s in ans["scores"]:
            i = self.ctx.index.get(s["pod"])
            if i is not None:
                m[i] = s["matched_blocks"]
        return m, ans["query_blocks"]


class RoundRobin(Router):
    name = "round-robin"

    def __init__(self, ctx):
        super().__init__(ctx)
        self.next = 0

    def route(self, req, kvr):
        with self.lock:
            i = self.next
            self.next = (i + 1) % self.n
        return i


class LeastLoaded(Router):
    name = "least-loaded"

    def __init__(self, ctx):
        super().__init__(ctx)
        self.tokens = [0] * self.n

    def route(self, req, kvr):
        with self.lock:
            i = self.argmin(self.tokens)
            self.tokens[i] += req.plen
        req.rstate = i
        return i

    def on_done(self, req):
        with self.lock:
            self.tokens[req.rstate] -= req.plen


class Kvrouterd(Router):
    """POST /v1/route. policy None = the daemon's default; loads: send true loads."""
    needs_kvr = True

    def __init__(self, ctx, name, policy=None, loads=False, sessions=False, pd=False):
        super().__init__(ctx)
        self.name = name
        self.policy = policy
        self.loads = loads
        self.sessions = sessions
        self.pd = pd  # candidates carry roles: the first ctx.pd_prefill engines prefill
        self.rr = 0

    def route(self, req, kvr):
        ctx = self.ctx
        if self.loads:
            cands = []
            for p, e in zip(ctx.pods, ctx.engines):
                cands.append('{"pod":%s,"active_requests":%d,"active_tokens":%d}'
                             % (json.dumps(p), e.num_active(), max(0, e.active_tokens)))
            cand = "[" + ",".join(cands) + "]"
        elif self.pd:
            cand = json.dumps([{"pod": p, "role": "prefill" if i < ctx.pd_prefill else "decode"}
                               for i, p in enumerate(ctx.pods)])
        else:
            cand = json.dumps([{"pod": p} for p in ctx.pods])
        body = '{"candidates":%s,%s%s"model":%s,"token_ids":[%s]}' % (
            cand, ('"policy":%s,' % json.dumps(self.policy)) if self.policy else "",
            ('"session_id":%s,' % json.dumps(req.session))
            if self.sessions and req.session else "",
            json.dumps(ctx.model), req.prompt.json_ids())
        status, ans = kvr.post("/v1/route", body)
        i = None
        if status == 200 and isinstance(ans, dict):
            i = ctx.index.get(ans.get("pod"))
            pre = ans.get("prefill")
            if self.pd and i is not None and isinstance(pre, dict) and pre.get("pod") in ctx.index:
                i = (ctx.index[pre["pod"]], i)  # disaggregated: (prefill, decode)
            req.kvr = (ans.get("matched_blocks"), ans.get("reason"))
            with self.lock:
                r = ans.get("reason", "?")
                self.reasons[r] = self.reasons.get(r, 0) + 1
        if i is None:  # the gateways' fallback: their own round-robin
            with self.lock:
                self.fallbacks += 1
                i = self.rr
                self.rr = (i + 1) % self.n
        return i


class PdRandom(Router):
    """Disaggregated baseline: a random prefill engine, the decode engine with the least
    outstanding tokens (its own count), every request split."""
    name = "pd-random"

    def __init__(self, ctx):
        super().__init__(ctx)
        self.tokens = [0] * self.n

    def route(self, req, kvr):
        with self.lock:
            p = self.rng.randrange(self.ctx.pd_prefill)
            dec = range(self.ctx.pd_prefill, self.n)
            d = min(dec, key=lambda k: (self.tokens[k], k))
            self.tokens[d] += req.plen
        req.rstate = d
        return (p, d)

    def on_done(self, req):
        with self.lock:
            self.tokens[req.rstate] -= req.plen


class SGLangCacheAware(Router):
    name = "sglang"
    needs_kvr = True

    def __init__(self, ctx, cache_threshold=0.3, abs_threshold=64, rel_threshold=1.5):
        super().__init__(ctx)
        self.load = [0] * self.n
        self.cache_threshold = cache_threshold
        self.abs_threshold = abs_threshold
        self.rel_threshold = rel_threshold

    def route(self, req, kvr):
        m, q = self.overlaps(req, kvr)
        with self.lock:
            load = self.load
            mx, mn = max(load), min(load)
            if mx - mn > self.abs_threshold and mx > self.rel_threshold * mn:
                i = self.argmin(load)
                why = "imbalanced"
            else:
                best = max(m)
                if q and best / q >= self.cache_threshold:
                    # the best match; among equal matches the less loaded
                    ties = [k for k in range(self.n) if m[k] == best]
                    i = self.argmin(load, ties)
                    why = "match"
                else:
                    i = self.argmin(load)
                    why = "least loaded"
            load[i] += 1
            self.reasons[why] = self.reasons.get(why, 0) + 1
        req.rstate = i
        return i

    def on_done(self, req):
        with self.lock:
            self.load[req.rstate] -= 1


class DynamoCost(Router):
    name = "dynamo"
    needs_kvr = True

    def __init__(self, ctx, overlap_weight=1.0):
        super().__init__(ctx)
        self.w = overlap_weight
        self.prefill = [0] * self.n          # tracked prefill tokens per engine
        self.active = [dict() for _ in range(self.n)]  # block hash -> requests holding it

    def route(self, req, kvr):
        m, q = self.overlaps(req, kvr)
        bs = self.ctx.block_size
        hashes = req.prompt.hashes
        with self.lock:
            costs = []
            new_tok = []
            for k in range(self.n):
                nt = max(0, req.plen - m[k] * bs)
                new_tok.append(nt)
                act = self.active[k]
                fresh = 0
                for h in hashes:
                    if h not in act:
                        fresh += 1
                costs.append(self.w * (self.prefill[k] + nt) / bs + len(act) + fresh)
            i = self.argmin(costs)
            self.prefill[i] += new_tok[i]
            act = self.active[i]
            for h in hashes:
                act[h] = act.get(h, 0) + 1
        req.rstate = (i, new_tok[i], True)
        return i

    def on_first_token(self, req):
        i, nt, pending = req.rstate
        if pending:
            with self.lock:
                self.prefill[i] -= nt
            req.rstate = (i, nt, False)

    def on_done(self, req):
        i, nt, pending = req.rstate
        with self.lock:
            if pending:
                self.prefill[i] -= nt
            act = self.active[i]
            for h in req.prompt.hashes:
                c = act.get(h, 0) - 1
                if c <= 0:
                    act.pop(h, None)
                else:
                    act[h] = c


class LlmD(Router):
    name = "llm-d"
    needs_kvr = True
    PREFILL_TOK_S = 15928.0
    TOKEN_CAP = 4 * 1024 * 1024

    def __init__(self, ctx, affinity=0.80):
        super().__init__(ctx)
        self.tokens = [0] * self.n
        self.affinity = affinity
        self.bound = ctx.llmd_ttft_bound

    def route(self, req, kvr):
        m, q = self.overlaps(req, kvr)
        with self.lock:
            tok = self.tokens
            allk = list(range(self.n))
            sticky = [k for k in allk if q and m[k] / q >= self.affinity]
            cands = allk
            why = "no affinity"
            if sticky:
                others = [k for k in allk if k not in sticky]
                cands = sticky
                why = "sticky"
                if others:
                    t_s = min(tok[k] for k in sticky) / self.PREFILL_TOK_S
                    t_o = min(tok[k] for k in others) / self.PREFILL_TOK_S
                    if t_s - t_o > self.bound:
                        cands = allk
                        why = "stickiness broken"
            score = [1.0 - min(1.0, t / self.TOKEN_CAP) for t in tok]
            neg = [-s for s in score]
            i = self.argmin(neg, cands)
            tok[i] += req.plen
            self.reasons[why] = self.reasons.get(why, 0) + 1
        req.rstate = i
        return i

    def on_done(self, req):
        with self.lock:
            self.tokens[req.rstate] -= req.plen


ROUTERS = {
    "round-robin": RoundRobin,
    "least-loaded": LeastLoaded,
    "kvrouterd-gw": lambda ctx: Kvrouterd(ctx, "kvrouterd-gw"),
    "kvrouterd-gw-sessions": lambda ctx: Kvrouterd(ctx, "kvrouterd-gw-sessions", sessions=True),
    "kvrouterd-pd": lambda ctx: Kvrouterd(ctx, "kvrouterd-pd", pd=True),
    "pd-random": PdRandom,
    "kvrouterd-cost-true": lambda ctx: Kvrouterd(ctx, "kvrouterd-cost-true", "cost", True),
    "kvrouterd-cache_aware-true": lambda ctx: Kvrouterd(ctx, "kvrouterd-cache_aware-true",
                                                        "cache_aware", True),
    "sglang": SGLangCacheAware,
    "dynamo": DynamoCost,
    "llm-d": LlmD,
}

DESCRIPTIONS = {
    "round-robin": "round-robin",
    "least-loaded": "least outstanding tokens (its own in-flight)",
    "kvrouterd-gw": "kvrouterd as the shipped gateways call it (no loads)",
    "kvrouterd-gw-sessions": "kvrouterd as the gateways call it, with the conversation as "
                             "session_id",
    "kvrouterd-pd": "kvrouterd, prefill and decode pools (candidates' roles): the pair it answers",
    "pd-random": "prefill and decode pools: a random prefill engine, the least-loaded decode",
    "kvrouterd-cost-true": "kvrouterd `cost`, true loads given by the gateway",
    "kvrouterd-cache_aware-true": "kvrouterd `cache_aware`, true loads given",
    "sglang": "SGLang `cache_aware` (its own in-flight counts)",
    "dynamo": "Dynamo cost (its own tracked prefill/decode load)",
    "llm-d": "llm-d (affinity filter + token load, its own in-flight)",
}


def split_replicas(name):
    """"ROUTER@N": N kvrouterd replicas sharing their decisions ([route] peers), the routing
    calls spread over them in turn; "ROUTER@Nu": the same without sharing. -> (router, N,
    share)."""
    base, _, rep = name.partition("@")
    if not rep:
        return name, 1, False
    share = not rep.endswith("u")
    n = int(rep[:-1] if not share else rep)
    if n < 1:
        raise ValueError("replicas must be >= 1 in %r" % name)
    return base, n, share


def make(name, ctx):
    """A router by name; "kvrouterd:<policy>" for any policy of the daemon; "@N" / "@Nu"
    suffixes: see split_replicas (the router is the same, run_cell starts the replicas)."""
    base, n, _ = split_replicas(name)
    if n > 1 or base != name:
        r = make(base, ctx)
        if not r.needs_kvr:
            raise ValueError("%r: replicas are for kvrouterd routers" % name)
        r.name = name
        return r
    if name.startswith("kvrouterd:"):
        pol = name.split(":", 1)[1] or None
        return Kvrouterd(ctx, name, pol, False)
    if name.startswith("llm-d:"):  # llm-d:<stickiness bound, s>
        bound = float(name.split(":", 1)[1])
        sub = Ctx(ctx.pods, ctx.model, ctx.block_size, ctx.engines, ctx.seed, bound)
        r = LlmD(sub)
        r.name = name
        return r
    f = ROUTERS.get(name)
    if f is None:
        raise ValueError("unknown router %r (known: %s, kvrouterd:<policy>)"
                         % (name, ", ".join(ROUTERS)))
    r = f(ctx)
    r.name = name
    return r


def describe(name):
    base, n, share = split_replicas(name)
    if base != name:
        return "%s, %d replicas%s" % (describe(base), n,
                                      " sharing decisions" if share else ", not sharing")
    if name.startswith("kvrouterd:"):
        return "kvrouterd `%s`, no loads" % (name.split(":", 1)[1] or "default")
    if name.startswith("llm-d:"):
        return "llm-d, stickiness bound %s s" % name.split(":", 1)[1]
    return DESCRIPTIONS.get(name, name)
