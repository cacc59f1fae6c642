-- wrk script: replay pre-signed deliveries, each exactly once.
--   wrk ... -s bench/wrk_presigned.lua URL -- FILE_PREFIX
-- Thread i reads FILE_PREFIX.i: whole HTTP requests, each after its length in bytes on a
-- line of its own (bench/ingest_bench.py write_presigned), so every request is distinct:
-- hookledger deduplicates and the baseline does not, so a repeat would skew the counts.
-- init() only reads the requests into a table: wrk starts each thread right after its init(),
-- and counts from when the last one has started, so a slow init() of the second thread is
-- load of the first one counted in no window.
-- At the end it prints one JSON line with the 2xx count and the latency percentiles (us).
-- There is no response() callback: with one, wrk parses every answer's headers and body
-- into Lua, which cost the generator as much CPU as a request's work in the service on
-- this 2-core machine. wrk counts answers of 400 and over itself (errors.status); every
-- other completed request was answered 2xx (neither contender redirects).

local threads = {}
local counter = 0

function setup(thread)
  thread:set("id", counter)
  counter = counter + 1
  table.insert(threads, thread)
end

function init(args)
  local file = assert(io.open(args[1] .. "." .. id, "rb"))
  requests = {}
  for length in file:lines() do  -- a length line, then that many bytes of request
    requests[#requests + 1] = file:read(tonumber(length))
  end
  file:close()
  sent, exhausted = 0, 0
end

function request()
  sent = sent + 1
  if sent > #requests then
    -- out of distinct deliveries: stop this thread rather than send a repeat
    exhausted = 1
    wrk.thread:stop()
    return wrk.format("GET", "/wrk-exhausted")
  end
  return requests[sent]
end

function done(summary, latency, requests)
  local any_exhausted = 0
  for _, thread in ipairs(threads) do
    any_exhausted = math.max(any_exhausted, thread:get("exhausted"))
  end
  local total_refused = summary.errors.status
  local total_ok = summary.requests - total_refused
  io.write(string.format(
    '{"requests": %d, "ok": %d, "refused": %d, "exhausted": %d, "duration_us": %d, ' ..
    '"connect_errors": %d, "read_errors": %d, "write_errors": %d, "timeouts": %d, ' ..
    '"p50_us": %d, "p90_us": %d, "p99_us": %d, "max_us": %d}\n',
    summary.requests, total_ok, total_refused, any_exhausted, summary.duration,
    summary.errors.connect, summary.errors.read, summary.errors.write,
    summary.errors.timeout, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency.max))
end
