-- kvrouter.lua — HAProxy (2.6+, Lua 5.3) action that asks kvrouterd where an OpenAI request goes.
--
-- Why: HAProxy cannot compute a KV-cache-aware choice itself; kvrouterd answers it in one
-- call (POST /v1/route). The action `lua.kvr_route` posts the buffered request body
-- (`option http-buffer-request`) to /v1/route with the backend's servers as candidates and
-- stores the chosen server's name in txn.kvr_server; the backend's
-- `use-server %[var(txn.kvr_server)] if { var(txn.kvr_server) -m found }` sends the request
-- there unchanged. On any failure (kvrouterd down or slower than the timeout, non-200, an
-- unknown pod, a body that is not a JSON object or larger than the buffer) the variable is
-- left unset and the backend's own `balance roundrobin` decides. txn.kvr_route says which
-- ("kvrouterd" or "round-robin"), for a response header or the log.
--
-- Pod names: every server of the backend is a candidate whose pod is the server's NAME.
-- Name a server after the engine's KV-event pod: `server 10.0.0.5:8000 10.0.0.5:8000` when
-- the engine publishes with pod = its address, or `server pod-a 10.0.0.5:8000` (a static
-- map pod -> address). An answered pod that is no server name but equals a server's address
-- also matches. Servers in DOWN or MAINT are not offered.
--
-- Usage: http-request lua.kvr_route <route URL> <backend> <timeout ms> <policy or ->
-- Load tracking: no "track" is sent (see README.md).

local function json_decode(s)
    local pos = 1
    local value

    local function skip()
        pos = s:find("[^ \t\r\n]", pos) or (#s + 1)
    end

    local function err(what)
        error(string.format("JSON: %s at byte %d", what, pos), 0)
    end

    local function str()
        pos = pos + 1 -- opening quote
        local out = {}
        while true do
            local c = s:sub(pos, pos)
            if c == "" then err("unterminated string") end
            if c == '"' then pos = pos + 1; break end
            if c == "\\" then
                local e = s:sub(pos + 1, pos + 1)
                local map = {['"'] = '"', ["\\"] = "\\", ["/"] = "/", b = "\b", f = "\f",
                             n = "\n", r = "\r", t = "\t"}
                if map[e] then
                    out[#out + 1] = map[e]; pos = pos + 2
                elseif e == "u" then
                    local hex = s:sub(pos + 2, pos + 5)
                    if not hex:match("^%x%x%x%x$") then err("bad \\u escape") end
                    local cp = tonumber(hex, 16); pos = pos + 6
                    if cp >= 0xD800 and cp <= 0xDBFF then -- a surrogate pair: one code point
                        local lo = s:match("^\\u(%x%x%x%x)", pos)
                        lo = lo and tonumber(lo, 16)
                        if not lo or lo < 0xDC00 or lo > 0xDFFF then err("lone surrogate") end
                        cp = 0x10000 + (cp - 0xD800) * 0x400 + (lo - 0xDC00); pos = pos + 6
                    elseif cp >= 0xDC00 and cp <= 0xDFFF then
                        err("lone surrogate")
                    end
                    out[#out + 1] = utf8.char(cp)
                else
                    err("bad escape")
                end
            else
                local j = s:find('["\\]', pos) or (#s + 1)
                out[#out + 1] = s:sub(pos, j - 1); pos = j
            end
        end
        return table.concat(out)
    end

    function value()
        skip()
        local c = s:sub(pos, pos)
        if c == "{" then
            local obj = {}
            pos = pos + 1; skip()
            if s:sub(pos, pos) == "}" then pos = pos + 1; return obj end
            while true do
                skip()
                if s:sub(pos, pos) ~= '"' then err("expected a key") end
                local k = str(); skip()
                if s:sub(pos, pos) ~= ":" then err("expected ':'") end
                pos = pos + 1
                obj[k] = value(); skip()
                local d = s:sub(pos, pos); pos = pos + 1
                if d == "}" then return obj end
                if d ~= "," then err("expected ',' or '}'") end
            end
        elseif c == "[" then
            local arr = {}
            pos = pos + 1; skip()
            if s:sub(pos, pos) == "]" then pos = pos + 1; return arr end
            while true do
                arr[#arr + 1] = value(); skip()
                local d = s:sub(pos, pos); pos = pos + 1
                if d == "]" then return arr end
                if d ~= "," then err("expected ',' or ']'") end
            end
        elseif c == '"' then
            return str()
        elseif s:sub(pos, pos + 3) == "true" then pos = pos + 4; return true
        elseif s:sub(pos, pos + 4) == "false" then pos = pos + 5; return false
        elseif s:sub(pos, pos + 3) == "null" then pos = pos + 4; return nil
        else
            local num = s:match("^-?%d+%.?%d*[eE]?[-+]?%d*", pos)
            if not num or num == "" then err("unexpected character") end
            pos = pos + #num
            return tonumber(num)
        end
    end

    local ok, res = pcall(function()
        local v = value(); skip()
        if pos <= #s then err("trailing bytes") end
        return v
    end)
    if ok then return res end
    return nil, res
end

local function json_string(s)
    return '"' .. s:gsub('[%c"\\]', function(c)
        if c == '"' then return '\\"' end
        if c == "\\" then return "\\\\" end
        return string.format("\\u%04x", c:byte())
    end) .. '"'
end

-- The backend's usable servers: list of names, and address -> name.
local function servers_of(backend)
    local be = core.backends[backend]
    local names, by_addr = {}, {}
    if not be then return names, by_addr end
    for name, srv in pairs(be.servers) do
        local st = srv:get_stats()
        local status = st and st.status or ""
        if not status:match("^DOWN") and not status:match("^MAINT") then
            names[#names + 1] = name
            by_addr[srv:get_addr()] = name
        end
    end
    table.sort(names)
    return names, by_addr
end

-- The route request: the client's JSON object with "candidates" (and "policy") spliced in
-- front of its own members, so the body is not re-encoded.
local function route_body(body, names, policy)
    local i = body:find("%S")
    if not i or body:sub(i, i) ~= "{" then return nil end
    local parts = {}
    if #names > 0 then
        local c = {}
        for k, n in ipairs(names) do c[k] = '{"pod":' .. json_string(n) .. "}" end
        parts[#parts + 1] = '"candidates":[' .. table.concat(c, ",") .. "]"
    end
    if policy and policy ~= "" and policy ~= "-" then parts[#parts + 1] = '"policy":' .. json_string(policy) end
    local rest = body:sub(i + 1)
    local head = "{" .. table.concat(parts, ",")
    if #parts > 0 and not rest:match("^%s*}") then head = head .. "," end
    return head .. rest
end

local function fallback(txn, why)
    txn:set_var("txn.kvr_route", "round-robin")
    txn:Info("kvrouter: round-robin (" .. why .. ")")
end

local function kvr_route(txn, url, backend, timeout_ms, policy)
    txn:set_var("txn.kvr_route", "round-robin")
    if not url or not backend then return fallback(txn, "usage: lua.kvr_route URL BACKEND") end
    local body = txn.f:req_body()
    local clen = tonumber(txn.f:req_hdr("content-length") or "")
    if not body or body == "" then return fallback(txn, "no body") end
    if clen and #body < clen then return fallback(txn, "body larger than tune.bufsize") end
    local names, by_addr = servers_of(backend)
    if #names == 0 then return fallback(txn, "no usable server in " .. backend) end
    local rb = route_body(body, names, policy)
    if not rb then return fallback(txn, "body is not a JSON object") end

    local hc = core.httpclient()
    local res = hc:post{url = url, body = rb, timeout = tonumber(timeout_ms) or 20,
                        headers = {["content-type"] = {"application/json"},
                                   ["content-length"] = {tostring(#rb)}}}
    if not res or not res.status or res.status == 0 then
        return fallback(txn, "kvrouterd did not answer")
    end
    if res.status ~= 200 then
        return fallback(txn, "kvrouterd HTTP " .. tostring(res.status))
    end
    local ans, jerr = json_decode(res.body or "")
    if type(ans) ~= "table" or type(ans.pod) ~= "string" then
        return fallback(txn, "bad answer: " .. tostring(jerr or "no pod"))
    end
    local name = nil
    for _, n in ipairs(names) do
        if n == ans.pod then name = n; break end
    end
    name = name or by_addr[ans.pod]
    if not name then return fallback(txn, "unknown pod " .. ans.pod) end
    txn:set_var("txn.kvr_server", name)
    txn:set_var("txn.kvr_route", "kvrouterd")
    -- disaggregated: the prefill worker for the decode engine's x-prefiller-host-port
    if type(ans.prefill) == "table" and type(ans.prefill.pod) == "string" and
       ans.prefill.pod:match("^[%w.%-:%[%]]+:%d+$") then
        txn:set_var("txn.kvr_prefill", ans.prefill.pod)
    end
end

core.register_action("kvr_route", {"http-req"}, kvr_route, 4)

-- For tests/integration/test_gateway_lua.py (the decoder and the splice against Python's
-- json); not used by HAProxy.
kvrouter_internals = {json_decode = json_decode, route_body = route_body}
