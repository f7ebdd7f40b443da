-- wrk_score.lua — POST /v1/score with realistic query bodies (bench/http_load.py writes them).
--
--   [WRK_DELAY_MS=N] wrk -s bench/wrk_score.lua URL -- FILE FORMAT
--     FILE    queries.json (one JSON body per line) or queries.mp (4-byte big-endian length
--             + msgpack body, repeated)
--     FORMAT  json | msgpack
--     WRK_PATH  the path posted to (default /v1/score; /v1/route takes the same bodies)
--     WRK_DELAY_MS  pause before each request on a connection (pacing: with C connections
--             the offered rate is about C * 1000 / (N + latency_ms)). wrk decides whether a
--             script has delay() before init() runs, so this comes from the environment.
--
-- Requests are formatted once in init(); request() cycles through them, each thread starting
-- at a random offset. done() prints non-2xx and socket errors and the latency percentiles.

local reqs = {}
local idx = 1
local pause = tonumber(os.getenv("WRK_DELAY_MS") or "0") or 0
local path = os.getenv("WRK_PATH") or "/v1/score"

local function read_all(path)
   local f = assert(io.open(path, "rb"))
   local data = f:read("*a")
   f:close()
   return data
end

function init(args)
   local file, format = args[1], args[2] or "json"
   local data = read_all(file)
   local bodies = {}
   if format == "msgpack" then
      local pos = 1
      while pos + 3 <= #data do
         local b1, b2, b3, b4 = data:byte(pos, pos + 3)
         local n = ((b1 * 256 + b2) * 256 + b3) * 256 + b4
         bodies[#bodies + 1] = data:sub(pos + 4, pos + 3 + n)
         pos = pos + 4 + n
      end
   else
      for line in data:gmatch("[^\n]+") do
         bodies[#bodies + 1] = line
      end
   end
   local ctype = format == "msgpack" and "application/msgpack" or "application/json"
   for i, b in ipairs(bodies) do
      reqs[i] = wrk.format("POST", path, {["Content-Type"] = ctype}, b)
   end
   idx = math.random(#reqs)
end

function request()
   local r = reqs[idx]
   idx = idx + 1
   if idx > #reqs then idx = 1 end
   return r
end

if pause > 0 then
   function delay()
      return pause
   end
end

function done(summary, latency, requests)
   local errors = summary.errors
   io.write(string.format("wrk_score: %d requests, non-2xx %d, socket errors %d/%d/%d/%d\n",
                          summary.requests, errors.status, errors.connect, errors.read,
                          errors.write, errors.timeout))
   io.write(string.format("LAT p50_us=%d p90_us=%d p99_us=%d max_us=%d\n",
                          latency:percentile(50), latency:percentile(90),
                          latency:percentile(99), latency.max))
end
