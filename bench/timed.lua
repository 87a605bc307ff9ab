-- wrk script: POST $BENCH_BODY_FILE like post.lua, but time every request itself and print
-- the percentiles of those raw latencies: one line "BENCH_RAW {...}" (milliseconds).
--
-- Why: before it reports, wrk "corrects" its latency histogram for coordinated omission
-- (stats_correct in wrk.c): every sample longer than twice the mean per-connection interval
-- gains synthetic samples at sample - k*interval. With a heavy-tailed server that invents a
-- smear of latencies no request had. Here each request is timed from the moment wrk builds it
-- (just before it is written) to its response.
--
-- Needs one connection per thread (wrk -tN -cN): request() and response() carry no connection
-- id, so they pair up only when a thread has a single connection. Each thread keeps its own
-- samples; done() collects them with thread:get().
local ffi = require("ffi")
ffi.cdef [[
typedef struct { long tv_sec; long tv_nsec; } bench_timespec;
int clock_gettime(int clk_id, bench_timespec *tp);
]]
local ts = ffi.new("bench_timespec")
local function now_ms()
  ffi.C.clock_gettime(1, ts) -- CLOCK_MONOTONIC
  return tonumber(ts.tv_sec) * 1000 + tonumber(ts.tv_nsec) / 1e6
end

local f = assert(io.open(os.getenv("BENCH_BODY_FILE"), "rb"))
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = "application/json"

local threads = {}
function setup(thread)
  table.insert(threads, thread)
end

-- per thread (each thread has its own Lua state)
samples = {}
bad = 0
local started = nil

function request()
  started = now_ms()
  return wrk.format()
end

function response(status, headers, body)
  if started ~= nil then
    samples[#samples + 1] = now_ms() - started
    started = nil
  end
  if status ~= 200 then
    bad = bad + 1
  end
end

local function percentile(sorted, p)
  if #sorted == 0 then
    return 0
  end
  local rank = math.ceil(p / 100 * #sorted)
  return sorted[math.max(rank, 1)]
end

function done(summary, latency, requests)
  local all, non200 = {}, 0
  for _, thread in ipairs(threads) do
    for _, v in ipairs(thread:get("samples")) do
      all[#all + 1] = v
    end
    non200 = non200 + thread:get("bad")
  end
  table.sort(all)
  local sum = 0
  for _, v in ipairs(all) do
    sum = sum + v
  end
  local e = summary.errors
  io.write(string.format(
    'BENCH_RAW {"samples": %d, "non_200": %d, "requests": %d, "duration_us": %d, ' ..
    '"errors": %d, "mean_ms": %.3f, "p50_ms": %.3f, "p90_ms": %.3f, "p99_ms": %.3f, ' ..
    '"max_ms": %.3f, "wrk_p99_ms": %.3f}\n',
    #all, non200, summary.requests, summary.duration,
    e.connect + e.read + e.write + e.timeout + e.status,
    #all > 0 and sum / #all or 0, percentile(all, 50), percentile(all, 90),
    percentile(all, 99), #all > 0 and all[#all] or 0, latency:percentile(99) / 1000))
end
