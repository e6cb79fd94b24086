-- Handlers of bench/otel.lua (loaded inside nginx): APISIX's pattern with
-- opentelemetry-lua -- the request's span started and attached in the
-- rewrite phase, a child span attached and detached in the content phase,
-- the request's span found with current(), finished and detached in the log
-- phase -- with opentelemetry-lua's default storage (ngx.ctx) or with
-- async_hooks.otel's storage and an isolated processor, or ("alocal") with
-- the default storage and an AsyncLocal set in rewrite and read in each
-- child (what the library's tracking costs these children by itself).  `children`: the
-- content phase also starts a child span in a light thread, an
-- ngx.timer.at callback and a coroutine.
local global = require("opentelemetry.global")
local context = require("opentelemetry.context")
local M = {}
local tracer, rid

--- init_by_lua, after install()
function M.init(adapter)
  local tracer_provider = require("opentelemetry.trace.tracer_provider")
  local batch_span_processor = require("opentelemetry.trace.batch_span_processor")
  local exporter = { export_spans = function() return true end, shutdown = function() end }
  local processor = batch_span_processor.new(exporter, { max_queue_size = 100000, max_export_batch_size = 1000 })
  if adapter == "alocal" then
    rid = require("async_hooks").AsyncLocal.new { name = "rid" }
  elseif adapter then
    local otel = require("async_hooks.otel")
    global.set_context_storage(otel.storage())
    otel.isolate(processor)
  end
  global.set_tracer_provider(tracer_provider.new(processor))
  tracer = global.tracer("bench")
end

function M.rewrite()
  if rid then rid:set(ngx.var.request_id) end
  local ctx = tracer:start(context.current(), "request")
  ngx.ctx.token = ctx:attach()
end

function M.content()
  local ctx, span = tracer:start(context.current(), "content")
  local tok = ctx:attach()
  span:finish()
  ctx:detach(tok)
  ngx.say("ok")
end

local function child(name)
  if rid then rid:get() end
  local ctx, span = tracer:start(context.current(), name)
  local tok = ctx:attach()
  span:finish()
  ctx:detach(tok)
end

local function timer_child(premature)
  if not premature then child("timer") end
end

function M.children()
  local th = ngx.thread.spawn(child, "thread")
  ngx.timer.at(0, timer_child)
  coroutine.wrap(child)("coroutine")
  ngx.thread.wait(th)
  M.content()
end

function M.log()
  local ctx = context.current()
  ctx:span():finish()
  ctx:detach(ngx.ctx.token)
end

return M
