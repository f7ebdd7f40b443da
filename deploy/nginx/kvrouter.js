// kvrouter.js — nginx (njs 0.7+) handler that asks kvrouterd where an OpenAI request goes.
//
// Why: nginx cannot compute a KV-cache-aware choice itself; kvrouterd answers it in one call
// (POST /v1/route). This handler (js_content) posts the client's body to /v1/route with the
// engines of this gateway as candidates, then internally redirects to a location that
// proxies the request unchanged to the chosen engine. Whatever goes wrong (kvrouterd down,
// slower than js_fetch_timeout, non-200, an answer naming an engine we do not know, a body we
// cannot route) ends in the named location @kvr_rr: plain round-robin over the upstream of
// all engines. The client never sees an error of the routing call.
//
// Configuration (nginx variables, see nginx.conf):
//   $kvr_route_url  kvrouterd's route URL, e.g. http://127.0.0.1:8080/v1/route (an IP
//                   literal, or a host name with a `resolver`)
//   $kvr_engines    space-separated engines: "host:port" (the pod name IS the address: the
//                   engine publishes KV events with topic kv@host:port@model) or
//                   "pod=host:port" (a static map from the pod name of the KV events to the
//                   engine address). Sent to kvrouterd as the candidates. Empty: no
//                   candidates are sent (kvrouterd picks among every worker it knows) and any
//                   answer that is itself a host:port is accepted.
//   $kvr_policy     "" (kvrouterd's [route] default), "cost", "cache_aware" or "score"
//   $kvr_pd_mode    disaggregated prefill and decode, when kvrouterd splits a request:
//                   "header" (default): the decode engine gets x-prefiller-host-port (llm-d's
//                   routing sidecar on the decode pod runs the remote prefill); "vllm": vLLM's
//                   own proxy pattern, two calls from here (prefillThenDecode below)
// Load tracking: no "track" is sent. njs cannot run code when the proxied response ends
// (no log-phase handler), so a tracked route could never be ended; loads come from the
// engines' own reports (or [route] defaults) instead. See README.md.

var ADDR_RE = /^([A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\]):[0-9]{1,5}$/;

function parseEngines(spec) {
    var map = {}, pods = [];
    (spec || '').split(/\s+/).forEach(function (item) {
        if (!item) {
            return;
        }
        var eq = item.indexOf('=');
        var pod = eq < 0 ? item : item.slice(0, eq);
        var addr = eq < 0 ? item : item.slice(eq + 1);
        if (!ADDR_RE.test(addr)) {
            return; // ignored: logged once per request below would be noise
        }
        map[pod] = addr;
        pods.push(pod);
    });
    return {map: map, pods: pods};
}

function fallback(r, why) {
    r.log('kvrouter: round-robin (' + why + ')');
    r.internalRedirect('@kvr_rr');
}

// The route request: the client's JSON object with "candidates" (and "policy") spliced in
// front of its own members, so the body is not re-serialized.
function routeBody(body, pods, policy) {
    var i = body.search(/\S/);
    if (i < 0 || body.charAt(i) !== '{') {
        return null;
    }
    var head = '{';
    if (pods.length) {
        head += '"candidates":' + JSON.stringify(pods.map(function (p) {
            return {pod: p};
        })) + ',';
    }
    if (policy) {
        head += '"policy":' + JSON.stringify(policy) + ',';
    }
    var rest = body.slice(i + 1);
    if (head.length > 1 && /^\s*\}/.test(rest)) {
        head = head.slice(0, -1); // an empty object: no trailing comma
    }
    return head + rest;
}

function route(r) {
    var v = r.variables;
    var url = v.kvr_route_url;
    var engines = parseEngines(v.kvr_engines);
    var body = r.requestText;
    if (r.method !== 'POST' || !url) {
        return fallback(r, 'not routable');
    }
    if (body === undefined || body === null) {
        // larger than client_body_buffer_size: kept in a temp file, not in memory
        return fallback(r, 'body not in memory');
    }
    var rb = routeBody(body, engines.pods, v.kvr_policy);
    if (rb === null) {
        return fallback(r, 'body is not a JSON object');
    }
    ngx.fetch(url, {method: 'POST', body: rb,
                    headers: {'Content-Type': 'application/json'}})
        .then(function (res) {
            if (res.status !== 200) {
                return res.text().then(function (t) {
                    throw new Error('kvrouterd HTTP ' + res.status + ' ' + t.slice(0, 120));
                });
            }
            return res.json();
        })
        .then(function (ans) {
            var pod = ans && ans.pod;
            if (typeof pod !== 'string') {
                throw new Error('no pod in the answer');
            }
            var addr = engines.map[pod];
            if (addr === undefined && engines.pods.length === 0 && ADDR_RE.test(pod)) {
                addr = pod;
            }
            if (addr === undefined) {
                throw new Error('unknown pod ' + pod);
            }
            // disaggregated: the decode engine, told where the prefill runs (an address:
            // the header names host:port)
            var pre = ans.prefill && ans.prefill.pod;
            var uri = '/_kvr_pod/' + addr + r.uri;
            if (typeof pre === 'string' && ADDR_RE.test(pre)) {
                uri = (v.kvr_pd_mode === 'vllm' ? '/_kvr_vpd/' : '/_kvr_pd/') + pre + '/' +
                      addr + r.uri;
            }
            if (v.args) {
                uri += '?' + v.args;
            }
            r.internalRedirect(uri);
        })
        .catch(function (e) {
            fallback(r, e.message || String(e));
        });
}

// vLLM's P/D proxy pattern (its NIXL connector's toy_proxy_server): the request goes to the
// prefill engine as a one-token, non-streamed completion asking for a remote decode
// (kv_transfer_params.do_remote_decode), and the kv_transfer_params of that answer (where the
// computed KV cache waits) go with the client's own request to the decode engine, whose
// answer (streamed or not) is the client's. Both calls carry one X-Request-Id (the client's,
// else nginx's $request_id). A prefill that fails is not retried: the decode engine serves
// the request alone, with the client's body unchanged (slower, never an error).
// Runs in the internal location /_kvr_vpd/<prefill>/<decode>/<uri>, whose js_fetch_timeout
// bounds the prefill call.
var PREFILL_PARAMS = {do_remote_decode: true, do_remote_prefill: false,
                      remote_engine_id: null, remote_block_ids: null,
                      remote_host: null, remote_port: null};

function prefillBody(req) {
    var p = JSON.parse(JSON.stringify(req));
    p.kv_transfer_params = PREFILL_PARAMS;
    p.stream = false;
    p.max_tokens = 1;
    if ('max_completion_tokens' in p) {
        p.max_completion_tokens = 1;
    }
    delete p.stream_options;      // only with stream
    delete p.min_tokens;          // not allowed above max_tokens; the decode call keeps them
    delete p.min_completion_tokens;
    return p;
}

function prefillThenDecode(r) {
    var v = r.variables;
    var path = v.kvr_path + (v.args ? '?' + v.args : '');
    var alone = '/_kvr_pod/' + v.kvr_addr + path;
    var req;
    try {
        req = JSON.parse(r.requestText);
    } catch (e) {
        req = null;
    }
    if (req === null || typeof req !== 'object' || Array.isArray(req)) {
        return r.internalRedirect(alone);
    }
    var id = r.headersIn['X-Request-Id'] || v.request_id;
    v.kvr_pd_request_id = id;
    var headers = {'Content-Type': 'application/json', 'X-Request-Id': id};
    if (r.headersIn.Authorization) {
        headers.Authorization = r.headersIn.Authorization;
    }
    ngx.fetch('http://' + v.kvr_prefill + path,
              {method: 'POST', body: JSON.stringify(prefillBody(req)), headers: headers})
        .then(function (res) {
            if (res.status !== 200) {
                throw new Error('prefill engine HTTP ' + res.status);
            }
            return res.json();
        })
        .then(function (ans) {
            var ktp = ans && ans.kv_transfer_params;
            if (ktp === null || typeof ktp !== 'object') {
                throw new Error('no kv_transfer_params in the prefill answer');
            }
            req.kv_transfer_params = ktp;
            v.kvr_pd_body = JSON.stringify(req);
            r.internalRedirect('/_kvr_vpd_dec/' + v.kvr_addr + path);
        })
        .catch(function (e) {
            r.log('kvrouter: decode engine alone (' + (e.message || String(e)) + ')');
            r.internalRedirect(alone);
        });
}

export default {route: route, routeBody: routeBody, parseEngines: parseEngines,
                prefillThenDecode: prefillThenDecode, prefillBody: prefillBody};
