-- wrk script: replay pre-signed deliveries, each exactly once.
--   wrk ... -s bench/wrk_presigned.lua URL -- FILE_PREFIX THREADS
-- Thread i reads FILE_PREFIX.i: whole HTTP requests, each after its length in bytes on a
-- line of its own (bench/ingest_bench.py write_presigned), so every request is distinct:
-- hookledger deduplicates and the baseline does not, so a repeat would skew the counts.
-- init() reads the requests into a table (about 0.55 s for 95,000 of them), then leaves a
-- marker FILE_PREFIX.ready.i. wrk runs each thread's init() in its main thread and starts
-- that thread right after it, but starts its clock only once the last thread has started,
-- while counting every answer: the first thread's load during the second's init() was
-- counted against a window that began after it (about 2% of a 15 s rate, both contenders
-- alike). So no thread sends anything until every thread's marker is there.
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
  prefix, every = args[1], tonumber(args[2])
  local marker = assert(io.open(prefix .. ".ready." .. id, "wb"))
  marker:close()
end

local function wait_for_every_thread()
  for t = 0, every - 1 do
    while true do  -- a spin before the clock starts: no sleep call without forking a shell
      local marker = io.open(prefix .. ".ready." .. t, "rb")
      if marker then marker:close() break end
    end
  end
  every = 0
end

function request()
  if every > 0 then
    -- wrk calls the first thread's request() once from its main thread, right after that
    -- thread's init(), to see whether requests can be pipelined: waiting there would wait
    -- for an init() that comes only after it
    if id == 0 and not verified then verified = true else wait_for_every_thread() end
  end
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
