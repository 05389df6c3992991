-- wrk script for bench/run.py: POSTs a JSON body and prints the results as one JSON line.
-- Environment: BENCH_BODY_FILE (the request body), BENCH_AUTHORIZATION (header value, optional).

local function read_file(path)
  local file = assert(io.open(path, "rb"), "cannot open " .. tostring(path))
  local data = file:read("*a")
  file:close()
  return data
end

wrk.method = "POST"
wrk.body = read_file(os.getenv("BENCH_BODY_FILE"))
wrk.headers["Content-Type"] = "application/json"
local authorization = os.getenv("BENCH_AUTHORIZATION")
if authorization ~= nil and authorization ~= "" then
  wrk.headers["Authorization"] = authorization
end

function done(summary, latency, requests)
  local e = summary.errors
  local out = string.format(
    '{"requests": %d, "duration_us": %d, "bytes": %d, '
      .. '"errors": {"connect": %d, "read": %d, "write": %d, "status": %d, "timeout": %d}, '
      .. '"latency_us": {"min": %d, "mean": %.1f, "stdev": %.1f, "max": %d, '
      .. '"p50": %d, "p75": %d, "p90": %d, "p99": %d, "p99.9": %d}}',
    summary.requests, summary.duration, summary.bytes,
    e.connect, e.read, e.write, e.status, e.timeout,
    latency.min, latency.mean, latency.stdev, latency.max,
    latency:percentile(50), latency:percentile(75), latency:percentile(90),
    latency:percentile(99), latency:percentile(99.9))
  io.write("BENCH_JSON " .. out .. "\n")
end
