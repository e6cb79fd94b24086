-- The handlers of spec/24-otel_openresty_spec.lua (loaded inside nginx;
-- LuaJIT): opentelemetry-lua with async_hooks.otel's storage (or, for the
-- control run, its default ngx.ctx), an in-memory exporter, requests that
-- start child spans in a light thread, a timer and a coroutine, and a
-- traceparent call to a second server.  Mismatches are collected in the
-- worker (one worker) and answered by /report.
local ah = require("async_hooks")
local otel = require("async_hooks.otel")
local global = require("opentelemetry.global")
local context = require("opentelemetry.context")
local tracer_provider = require("opentelemetry.trace.tracer_provider")
local batch_span_processor = require("opentelemetry.trace.batch_span_processor")
local propagator = require("opentelemetry.trace.propagation.text_map.trace_context_propagator").new()

local A = {}

local rid = ah.AsyncLocal.new { name = "rid", default = "-" }
local tracer, provider
local bad = {}       -- mismatches, as text
local done = 0       -- children that finished
local spans = {}     -- what the isolated exporter received
local exports = {}   -- per exporter: calls, calls made in a request's context

local function expect(what, want, got)
  if want ~= got then
    bad[#bad + 1] = ("%s: %s expected, got %s"):format(what, tostring(want), tostring(got))
  end
end

local function jitter(id)
  ngx.sleep((tonumber(id:match("%d+")) or 0) % 5 * 0.002)
end

-- records every span; counts the exports made where a request's value or
-- a current span can be seen
local function exporter(name, keep)
  exports[name] = { calls = 0, in_request = 0 }
  return {
    export_spans = function(_, batch)
      local e = exports[name]
      e.calls = e.calls + 1
      if rid:get() ~= "-" or context.current():span_context():is_valid() then
        e.in_request = e.in_request + 1
      end
      if keep then
        for _, s in ipairs(batch) do
          spans[#spans + 1] = { name = s.name, trace = s.ctx.trace_id, id = s.ctx.span_id,
            parent = s.parent_ctx and s.parent_ctx.span_id or "none" }
        end
      end
      return true
    end,
    force_flush = function() end,
    shutdown = function() end,
  }
end

--- init_by_lua, after install(): adapter = false keeps opentelemetry-lua's
-- default storage (ngx.ctx) and leaves its processor as it is
function A.init(adapter)
  local opts = { inactive_timeout = 0.05, batch_timeout = 0.05 }
  local isolated = batch_span_processor.new(exporter("isolated", true), opts)
  if adapter then
    global.set_context_storage(otel.storage())
    otel.isolate(isolated)
  end
  -- a second processor, never isolated: its exports run in requests
  local control = batch_span_processor.new(exporter("control", false), opts)
  provider = tracer_provider.new({ isolated, control })
  global.set_tracer_provider(provider)
  tracer = global.tracer("async_hooks spec")
end

--- rewrite: the request's span (joining an incoming traceparent), attached
-- until the log phase, as APISIX does
function A.rewrite()
  local id = ngx.var.arg_id
  rid:set(id)
  local parent = propagator:extract(context.current(), ngx.req)
  local ctx, span = tracer:start(parent, "request " .. id)
  ngx.ctx.otel_token = ctx:attach()
  ngx.ctx.otel_span = span
end

--- log: current() is still the request's span; it ends and detaches
function A.log()
  local id = rid:get()
  local cur = context.current()
  expect("log phase's current span " .. id, ngx.ctx.otel_span, cur and cur:span())
  ngx.ctx.otel_span:finish()
  expect("log phase's detach " .. id, true, cur and (cur:detach(ngx.ctx.otel_token)))
end

-- a child of the current span, with a grandchild, in whatever runs it
local function child(kind, id, parent_id, co)
  local parent = context.current()
  expect(kind .. "'s parent " .. id, parent_id, parent:span_context().span_id)
  local c, sp = tracer:start(parent, kind .. " " .. id)
  local tok = c:attach()
  if co then coroutine.yield() end
  jitter(id)
  expect(kind .. "'s current span " .. id, sp, context.current():span())
  local g, gsp = tracer:start(context.current(), kind .. "/inner " .. id)
  local gtok = g:attach()
  ngx.sleep(0.001)
  expect(kind .. "/inner's current span " .. id, gsp, context.current():span())
  gsp:finish()
  expect(kind .. "/inner's detach " .. id, true, (g:detach(gtok)))
  expect(kind .. "'s current span after its child " .. id, sp, context.current():span())
  sp:finish()
  expect(kind .. "'s detach " .. id, true, (c:detach(tok)))
  done = done + 1
end

--- content: a content span attached while a light thread, a timer and a
-- coroutine are started, detached before they read it
function A.content()
  local id = rid:get()
  local req_span = ngx.ctx.otel_span
  expect("content's current span " .. id, req_span, context.current():span())
  local cctx, cspan = tracer:start(context.current(), "content " .. id)
  local ctok = cctx:attach()
  local csid = cspan:context().span_id
  local th = ngx.thread.spawn(child, "thread", id, csid)
  assert(ngx.timer.at(0, function(premature)
    if not premature then child("timer", id, csid) end
  end))
  local co = coroutine.wrap(child)
  co("coroutine", id, csid, true) -- until its yield
  expect("content's detach " .. id, true, (cctx:detach(ctok)))
  expect("content's current span after detach " .. id, req_span, context.current():span())
  jitter(id)
  co()
  assert(ngx.thread.wait(th))
  expect("content's current span at the end " .. id, req_span, context.current():span())
  cspan:finish()
  ngx.say("ok")
end

--- the caller: a light thread starts a client span and calls the upstream
-- with a traceparent; the upstream's request span must be its child
function A.call()
  local id = rid:get()
  local th = ngx.thread.spawn(function()
    local c, sp = tracer:start(context.current(), "client " .. id)
    local tok = c:attach()
    local head = {}
    propagator:inject(context.current(), { set_header = function(k, v) head[#head + 1] = k .. ": " .. v end })
    local sock = ngx.socket.tcp()
    sock:settimeout(5000)
    assert(sock:connect("127.0.0.1", tonumber(ngx.var.up_port)))
    assert(sock:send(("GET /up?id=up%s HTTP/1.0\r\nHost: up\r\n%s\r\n\r\n"):format(id, table.concat(head, "\r\n"))))
    local resp = assert(sock:receive("*a"))
    sock:close()
    local trace, parent = resp:match("\r\n\r\n(%x+) (%x+)")
    expect("upstream's trace " .. id, sp:context().trace_id, trace)
    expect("upstream's parent " .. id, sp:context().span_id, parent)
    expect("client's current span " .. id, sp, context.current():span())
    sp:finish()
    expect("client's detach " .. id, true, (c:detach(tok)))
  end)
  assert(ngx.thread.wait(th))
  expect("caller's current span " .. id, ngx.ctx.otel_span, context.current():span())
  ngx.say("ok")
end

--- the upstream: answers the trace and parent of its request span; a
-- light thread starts a child of it
function A.up()
  local id = rid:get()
  local span = ngx.ctx.otel_span
  local th = ngx.thread.spawn(function()
    local parent = context.current()
    expect("upstream thread's parent " .. id, span:context().span_id, parent:span_context().span_id)
    local c, sp = tracer:start(parent, "upthread " .. id)
    local tok = c:attach()
    jitter(id)
    sp:finish()
    expect("upstream thread's detach " .. id, true, (c:detach(tok)))
  end)
  assert(ngx.thread.wait(th))
  ngx.say(span:context().trace_id, " ", span.parent_ctx.span_id)
end

--- the report: waits until `n` children are done and the isolated
-- exporter has `spans` spans (flushed from a request whose value is set),
-- then answers "key value" lines and the mismatches
function A.report()
  rid:set("report")
  local n, want = tonumber(ngx.var.arg_children), tonumber(ngx.var.arg_spans)
  for _ = 1, 500 do
    if done >= n and #spans >= want then break end
    provider:force_flush()
    ngx.sleep(0.01)
  end
  ngx.sleep(0.2) -- the control processor's timers
  -- group the spans by request: "<kind> <id>"
  local by_id, traces = {}, {}
  for _, s in ipairs(spans) do
    local kind, id = s.name:match("^(%S+) (%S+)$")
    local r = by_id[id] or {}
    by_id[id] = r
    r[kind] = s
    traces[s.trace] = traces[s.trace] or {}
    traces[s.trace][id] = true
  end
  local tree = {
    content = "request", thread = "content", timer = "content", coroutine = "content",
    ["thread/inner"] = "thread", ["timer/inner"] = "timer", ["coroutine/inner"] = "coroutine",
    client = "request", upthread = "request",
  }
  local ntraces = 0
  for _ in pairs(traces) do ntraces = ntraces + 1 end
  for id, r in pairs(by_id) do
    for kind, s in pairs(r) do
      local p = tree[kind]
      if p then
        expect("exported parent of " .. kind .. " " .. id, r[p] and r[p].id, s.parent)
      end
      expect("trace of " .. kind .. " " .. id, r.request and r.request.trace, s.trace)
    end
  end
  -- the upstream's request span is the caller's client span's child
  for id, r in pairs(by_id) do
    local caller = id:match("^up(.*)$")
    if caller then
      local c = by_id[caller] and by_id[caller].client
      expect("upstream request's parent " .. id, c and c.id, r.request.parent)
      expect("upstream request's trace " .. id, c and c.trace, r.request.trace)
    end
  end
  ngx.say("done ", done)
  ngx.say("spans ", #spans)
  ngx.say("traces ", ntraces)
  ngx.say("isolated_calls ", exports.isolated.calls)
  ngx.say("isolated_in_request ", exports.isolated.in_request)
  ngx.say("control_calls ", exports.control.calls)
  ngx.say("control_in_request ", exports.control.in_request)
  ngx.say("bad ", #bad)
  for i = 1, math.min(#bad, 20) do ngx.say("! ", bad[i]) end
end

return A
