--- Request tracing on async_hooks: W3C Trace Context across two luv HTTP
-- servers on loopback, and a per-request span tree built from `createHook`.
--
-- The *front* server reads an incoming `traceparent` header (or starts a
-- trace when there is none or it is invalid), keeps the trace context in an
-- `AsyncLocal`, does some I/O (a timer, a file, a DNS lookup) and calls the
-- *upstream* server with a child `traceparent`.  Nothing passes the context
-- along: the logger and the tracer read it from the `AsyncLocal`.  The
-- tracer turns every luv resource created in a request's context into a
-- span named by the resource's `op`, with its `path`/`host`/`port`/`service`,
-- timed with `uv.hrtime` from `init` to `destroy`, and prints the request's
-- tree once every span in it has ended.
--
-- Run: `lua5.4 examples/tracing.lua [requests]` from the repository root.
-- Used as a module (`require("tracing")` with `examples/?.lua` on the path)
-- it returns the trace-context helpers and `run`, for the specs.
-- @module tracing
if not package.searchpath("app", package.path) then
  package.path = "examples/?.lua;" .. package.path
end
local uv = require("luv") -- luv first, on the main thread
local ah = require("async_hooks").install()
local app = require("app")

local T = {}

-- ------------------------------------------------------------------------
-- W3C Trace Context: traceparent = version-traceid-parentid-flags
-- (https://www.w3.org/TR/trace-context/#traceparent-header)

local ZERO_TRACE, ZERO_SPAN = ("0"):rep(32), ("0"):rep(16)

--- Parse a `traceparent` header value.
-- Lowercase hex only; version `ff` is invalid; version `00` has exactly four
-- fields; a higher version is read the same way when it is followed by
-- nothing or by `-` (forward compatibility, as the spec asks); trace id
-- (32 hex) and parent id (16 hex) must not be all zeros; flags are 2 hex.
-- @tparam string header
-- @treturn table|nil `{version, trace_id, parent_id, flags, sampled}`
-- @treturn string why it is invalid (when nil)
function T.parse(header)
  if type(header) ~= "string" then return nil, "no header" end
  header = header:match("^[ \t]*(.-)[ \t]*$")
  local v, tid, pid, flags, rest =
    header:match("^(%x%x)%-(%x+)%-(%x+)%-(%x%x)(.*)$")
  if not v then return nil, "malformed" end
  if (v .. tid .. pid .. flags):find("[^0-9a-f]") then return nil, "not lowercase hex" end
  if v == "ff" then return nil, "version ff is invalid" end
  if #tid ~= 32 then return nil, "trace-id is not 32 hex digits" end
  if #pid ~= 16 then return nil, "parent-id is not 16 hex digits" end
  if tid == ZERO_TRACE then return nil, "trace-id is all zeros" end
  if pid == ZERO_SPAN then return nil, "parent-id is all zeros" end
  if v == "00" and rest ~= "" then return nil, "version 00 has exactly 4 fields" end
  if rest ~= "" and rest:sub(1, 1) ~= "-" then return nil, "malformed" end
  return { version = v, trace_id = tid, parent_id = pid, flags = flags,
           sampled = tonumber(flags, 16) % 2 == 1 }
end

--- Is `header` a valid `traceparent`?
function T.valid(header)
  return T.parse(header) ~= nil
end

--- Format a version-00 `traceparent` (raises on invalid ids: a bug).
-- @tparam string trace_id 32 lowercase hex digits, not all zeros
-- @tparam string span_id 16 lowercase hex digits, not all zeros
-- @tparam[opt="01"] string flags 2 lowercase hex digits
function T.format(trace_id, span_id, flags)
  local h = ("00-%s-%s-%s"):format(trace_id, span_id, flags or "01")
  local ok, why = T.parse(h)
  if not ok then error("traceparent: " .. why, 2) end
  return h
end

--- `n` random lowercase hex digits (n a multiple of 8), not all zeros.
function T.random_hex(n)
  local s
  repeat
    local t = {}
    for i = 1, n // 8 do t[i] = ("%08x"):format(math.random(0, 0xffffffff)) end
    s = table.concat(t)
  until s:find("[^0]")
  return s
end

-- ------------------------------------------------------------------------
-- context and spans

--- The current trace context: `{trace_id, flags, span, request, service}`
-- where `span` is the span that new work becomes a child of.
T.context = ah.AsyncLocal.new { name = "trace" }

local function new_span(parent, name, attrs)
  local s = { name = name, attrs = attrs or "", start = uv.hrtime(), children = {},
              parent = parent, root = parent and parent.root }
  if parent then
    parent.children[#parent.children + 1] = s
    s.root.open = s.root.open + 1
  end
  return s
end

local on_complete -- function(root), set by run()

local function end_span(s)
  if s.finish then return end
  s.finish = uv.hrtime()
  local root = s.root
  if s ~= root then root.open = root.open - 1 end
  if root.finish and root.open == 0 and not root.complete then
    root.complete = true
    if on_complete then on_complete(root) end
  end
end

--- Start a request: its root span continues the trace of a valid incoming
-- `traceparent`, else starts a new one.  Returns the context to run in.
function T.start_request(service, name, header, request)
  local parent = T.parse(header)
  local root = new_span(nil, name)
  root.root, root.open, root.service, root.request = root, 0, service, request
  root.span_id = T.random_hex(16)
  root.incoming = parent
  root.trace_id = parent and parent.trace_id or T.random_hex(32)
  root.parent_id = parent and parent.parent_id
  -- version 00 flags pass through; of a later version only "sampled"
  root.flags = parent and (parent.version == "00" and parent.flags
    or (parent.sampled and "01" or "00")) or "01"
  return { trace_id = root.trace_id, flags = root.flags, span = root,
           request = request, service = service }
end

--- Run `fn(span)` in a child span of the current one (an explicit span,
-- with its own id for an outbound `traceparent`); the span ends when `fn`
-- returns.  `fn` may yield (inside a coroutine).
function T.with_span(name, fn)
  local ctx = T.context:get()
  local span = new_span(ctx.span, name)
  span.span_id = T.random_hex(16)
  local child = { trace_id = ctx.trace_id, flags = ctx.flags, span = span,
                  request = ctx.request, service = ctx.service }
  return T.context:run(child, function()
    local r = table.pack(fn(span))
    end_span(span)
    return table.unpack(r, 1, r.n)
  end)
end

--- The `traceparent` to send from the current span.
function T.traceparent()
  local ctx = T.context:get()
  return T.format(ctx.trace_id, ctx.span.span_id, ctx.flags)
end

-- what a resource says about itself
local function describe(res)
  local a = {}
  for _, k in ipairs { "path", "new_path", "host", "port", "service" } do
    local v = rawget(res, k)
    if v ~= nil then a[#a + 1] = k .. "=" .. tostring(v) end
  end
  return table.concat(a, " ")
end

local by_id = {} -- asyncId -> span (until destroy)

--- The tracer: every luv resource made in a traced context is a span, a
-- child of the span of the callback that made it when that callback belongs
-- to the same span scope, else of the context's current span.
T.hook = ah.createHook {
  init = function(id, _, trigger, res)
    local ctx = T.context:get()
    if not ctx or type(res) ~= "table" or rawget(res, "op") == nil then return end
    local parent = by_id[trigger]
    if not (parent and parent.scope == ctx.span) then parent = ctx.span end
    local s = new_span(parent, res.op, describe(res))
    s.scope = ctx.span
    by_id[id] = s
  end,
  before = function(id)
    local s = by_id[id]
    if s then s.calls = (s.calls or 0) + 1 end
  end,
  destroy = function(id)
    local s = by_id[id]
    if s then
      by_id[id] = nil
      end_span(s)
    end
  end,
}

--- The span tree as indented lines: name, attributes, start offset from
-- the root and duration in ms.
function T.render(root)
  local out = {}
  local function ms(ns) return ns / 1e6 end
  local function walk(s, depth)
    local label = ("  "):rep(depth) .. s.name .. (s.attrs ~= "" and ("  " .. s.attrs) or "")
    if s.span_id then label = label .. "  [span " .. s.span_id .. "]" end
    out[#out + 1] = ("%-72s +%6.2f %6.2f ms"):format(label, ms(s.start - root.start),
      ms((s.finish or s.start) - s.start))
    table.sort(s.children, function(a, b) return a.start < b.start end)
    for _, c in ipairs(s.children) do walk(c, depth + 1) end
  end
  out[#out + 1] = ("trace %s  %s %s%s"):format(root.trace_id, root.service, root.request or "-",
    root.parent_id and ("  (parent span " .. root.parent_id .. ")") or "  (new trace)")
  walk(root, 0)
  return table.concat(out, "\n")
end

-- ------------------------------------------------------------------------
-- logging: every line carries the trace context it was written in

T.lines = {}
T.echo = false

--- Log a line prefixed with the current trace and span ids.
function T.log(fmt, ...)
  local ctx = T.context:get()
  local text = fmt:format(...)
  local line = ("[%s trace=%s span=%s] %s"):format(ctx and ctx.service or "-",
    ctx and ctx.trace_id or "-", ctx and ctx.span.root.span_id or "-", text)
  T.lines[#T.lines + 1] = { ctx = ctx, text = text, line = line }
  if T.echo then print(line) end
end

-- ------------------------------------------------------------------------
-- the two servers

local function await(start) return app.await(start) end

-- a request's own file: written, closed and removed (spans with its path)
local function audit(dir, request)
  local path = ("%s/%s.log"):format(dir, request)
  local err, fd = await(function(k) uv.fs_open(path, "w", 384, k) end)
  assert(not err, err)
  await(function(k) uv.fs_write(fd, T.traceparent() .. "\n", 0, k) end)
  await(function(k) uv.fs_close(fd, k) end)
  await(function(k) uv.fs_unlink(path, k) end)
end

local function front_handler(up_port, dir)
  return function(req, respond)
    local request = req.headers["x-request-id"] or "?"
    local ctx = T.start_request("front", "GET " .. req.path, req.headers.traceparent, request)
    T.context:run(ctx, function()
      coroutine.wrap(function()
        T.log("GET %s (incoming traceparent %s)", req.path,
          ctx.span.incoming and "valid" or req.headers.traceparent and "invalid" or "absent")
        local ms = tonumber(req.path:match("(%d+)$")) or 1
        app.sleep(ms % 7 + 1)
        T.log("%s slept %d ms", request, ms % 7 + 1)
        audit(dir, request)
        local err, addrs = await(function(k)
          uv.getaddrinfo("localhost", tostring(up_port), { family = "inet", socktype = "stream" }, k)
        end)
        assert(not err, err)
        local body = T.with_span("GET upstream /stock", function()
          return await(function(k)
            app.http_get(addrs[1].port, "/stock/" .. request,
              { traceparent = T.traceparent(), ["X-Request-Id"] = request }, k)
          end)
        end)
        T.log("%s: upstream answered %s", request, tostring(body))
        respond(("trace=%s upstream=%s"):format(ctx.trace_id, tostring(body)))
        end_span(ctx.span)
      end)()
    end)
  end
end

local function upstream_handler(seen)
  return function(req, respond)
    local request = req.headers["x-request-id"] or "?"
    seen[#seen + 1] = { request = request, traceparent = req.headers.traceparent }
    local ctx = T.start_request("upstream", "GET " .. req.path, req.headers.traceparent, request)
    T.context:run(ctx, function()
      coroutine.wrap(function()
        T.log("upstream GET %s", req.path)
        app.sleep(1)
        respond(req.headers.traceparent or "-")
        end_span(ctx.span)
      end)()
    end)
  end
end

--- Start both servers, send `opts.requests` concurrent requests to the front
-- (request i carries `opts.headers(i)` as headers; default: a valid
-- traceparent for two thirds, none or an invalid one for the rest), run the
-- loop until every answer arrived and every span tree is complete.
-- @return `{answers = {[request] = body}, trees = {root, ...}, upstream = seen,
--   lines = log lines, sent = {[request] = headers}, up_port}`
function T.run(opts)
  opts = opts or {}
  local n = opts.requests or 3
  T.lines, by_id = {}, {}
  local trees, answers, sent, seen = {}, {}, {}, {}
  local dir = assert(uv.fs_mkdtemp(os.tmpname() .. "-XXXXXX"))
  local upstream, up_port = app.http_server(upstream_handler(seen))
  local front, port = app.http_server(front_handler(up_port, dir))
  local pending = n * 3 -- answers, front trees, upstream trees
  local function done()
    pending = pending - 1
    if pending == 0 then
      front:close()
      upstream:close()
    end
  end
  on_complete = function(root)
    trees[#trees + 1] = root
    if opts.print then print("\n" .. T.render(root)) end
    done()
  end
  T.hook:enable()
  for i = 1, n do
    local request = ("r%02d"):format(i)
    local headers = opts.headers and opts.headers(i) or
      (i % 3 == 1 and { traceparent = T.format(T.random_hex(32), T.random_hex(16), "01") }) or
      (i % 3 == 2 and {}) or { traceparent = "00-not-a-valid-header-01" }
    headers["X-Request-Id"] = request
    sent[request] = headers
    app.http_get(port, ("/item/%d"):format(i), headers, function(body)
      answers[request] = body
      done()
    end)
  end
  uv.run()
  T.hook:disable()
  on_complete = nil
  uv.fs_rmdir(dir)
  return { answers = answers, trees = trees, upstream = seen, lines = T.lines, sent = sent,
           up_port = up_port }
end

-- run as a script: a few requests, trees and log lines printed
if not (... or ""):match("tracing$") then
  T.echo = true
  local n = tonumber((...)) or 3
  print(("tracing: %d requests (valid, absent and invalid incoming traceparent)\n"):format(n))
  local r = T.run { requests = n, print = true }
  local ok = 0
  for _ in pairs(r.answers) do ok = ok + 1 end
  print(("\n%d answers, %d span trees, %d log lines"):format(ok, #r.trees, #r.lines))
  ah.uninstall()
end

return T
