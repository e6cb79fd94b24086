-- async_hooks.otel inside a real nginx with opentelemetry-lua (its lib/
-- folder: AH_OTEL_LUA, else ../shared/external/opentelemetry-lua/lib next
-- to the repository; skipped when absent): concurrent requests start child
-- spans in a light thread, an ngx.timer.at callback and a coroutine; the
-- batch span processor exports outside every request; a traceparent joins
-- a second server's spans to the caller's trace.  Handlers:
-- spec/support/ah_otel_app.lua.  Suite: `make openresty`; AH_OTEL_DEBUG=1
-- prints the report.
local N = require("support.nginx")

local OTEL = os.getenv("AH_OTEL_LUA") or (N.ROOT .. "/../shared/external/opentelemetry-lua/lib")
local have_otel = io.open(OTEL .. "/opentelemetry/context.lua") ~= nil

local REQUESTS, CALLS = 30, 10

local function phases(content)
  return ([[
      rewrite_by_lua_block { require("ah_otel_app").rewrite() }
      content_by_lua_block { require("ah_otel_app").%s() }
      log_by_lua_block { require("ah_otel_app").log() }]]):format(content)
end

-- nginx with the storage and isolate() (adapter) or without them
local function start(adapter)
  local up = N.free_port()
  return N.start {
    lua_path = OTEL .. "/?.lua;" .. OTEL .. "/?/init.lua",
    http = ([[
  init_by_lua_block {
    require("async_hooks").install()
    require("ah_otel_app").init(%s)
  }
  server {
    listen 127.0.0.1:%d;
    location /up { %s }
  }]]):format(tostring(adapter), up, phases("up")),
    server = ([[
    location /trace { %s }
    location /call { set $up_port %d; %s }
    location /report { content_by_lua_block { require("ah_otel_app").report() } }]]):format(phases("content"), up,
      phases("call")),
  }
end

-- the requests, all at once; then the report as a table of numbers and the
-- list of mismatches
local function run(srv, children, spans)
  local paths = {}
  for i = 1, REQUESTS do paths[#paths + 1] = "/trace?id=" .. i end
  for i = 1, CALLS do paths[#paths + 1] = "/call?id=c" .. i end
  local res = srv:get_many(paths, 30)
  for i, r in ipairs(res) do
    assert.are.equal(200, r[1], paths[i] .. ": " .. tostring(r[2]) .. "\n" .. srv:errors())
    assert.are.equal("ok\n", r[2])
  end
  local st, body = srv:get(("/report?children=%d&spans=%d"):format(children, spans), 30)
  assert.are.equal(200, st, body)
  if os.getenv("AH_OTEL_DEBUG") then io.stderr:write(body) end
  local report, bad = {}, {}
  for line in body:gmatch("[^\n]+") do
    local k, v = line:match("^(%S+) (%d+)$")
    if k then report[k] = tonumber(v) else bad[#bad + 1] = line end
  end
  return report, bad
end

describe("#openresty async_hooks.otel with opentelemetry-lua in nginx", function()
  if not have_otel then
    it("needs opentelemetry-lua", function()
      pending("opentelemetry-lua's lib/ not found at " .. OTEL .. " (set AH_OTEL_LUA)")
    end)
    return
  end

  it("every child has the right parent, one trace per request, every detach true; exports run in no request", function()
    local srv = start(true)
    local ok, err = pcall(function()
      -- spans: each /trace 8 (request, content, 3 children, 3 inner); each
      -- /call 4 (request, client; the upstream's request and its thread)
      local report, bad = run(srv, 3 * REQUESTS, 8 * REQUESTS + 4 * CALLS)
      assert.same({}, bad)
      assert.are.equal(0, report.bad)
      assert.are.equal(3 * REQUESTS, report.done)
      assert.are.equal(8 * REQUESTS + 4 * CALLS, report.spans)
      assert.are.equal(REQUESTS + CALLS, report.traces)
      assert.is_true(report.isolated_calls > 0)
      assert.are.equal(0, report.isolated_in_request)
      -- the processor left as it is exports inside requests
      assert.is_true(report.control_in_request > 0)
    end)
    local log = srv:stop()
    assert(ok, err)
    assert.is_nil(log:match("%[error%]"), log)
  end)

  it("without the storage (ngx.ctx) the same requests get wrong parents and extra traces", function()
    local srv = start(false)
    local ok, err = pcall(function()
      local report = run(srv, 0, 0)
      assert.is_true(report.bad > 0)
      assert.is_true(report.traces > REQUESTS + CALLS)
    end)
    srv:stop()
    assert(ok, err)
  end)
end)
