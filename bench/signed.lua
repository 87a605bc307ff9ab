-- wrk script: post.lua with a SigV4 signature made once (BENCH_AUTHORIZATION, BENCH_DATE):
-- when done, print one line "BENCH_JSON {...}" (latencies in microseconds). Same as
-- the peer harness's _lib/post.lua, so figures here and in the peer harness are comparable.
local f = assert(io.open(os.getenv("BENCH_BODY_FILE"), "rb"))
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = os.getenv("BENCH_AUTHORIZATION")
wrk.headers["X-Amz-Date"] = os.getenv("BENCH_DATE")

done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'BENCH_JSON {"requests": %d, "duration_us": %d, "bytes": %d, "err_connect": %d, ' ..
    '"err_read": %d, "err_write": %d, "err_status": %d, "err_timeout": %d, ' ..
    '"lat_mean_us": %.1f, "lat_max_us": %d, "p50_us": %d, "p90_us": %d, "p99_us": %d}\n',
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write, e.status,
    e.timeout, latency.mean, latency.max, latency:percentile(50), latency:percentile(90),
    latency:percentile(99)))
end
