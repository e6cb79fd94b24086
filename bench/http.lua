--- Benchmark 5 (Node's async-resource-vs-destroy): the demo server shape
-- driven by wrk on loopback, two styles x four context types, at 50 and 500
-- connections; Node's AsyncLocalStorage and empty-hooks variants of the same
-- shape beside it when `node` is installed.
local U = require("util")
local SECONDS = tonumber(os.getenv("BENCH_HTTP_SECONDS")) or 2

local function have(cmd) return os.execute("command -v " .. cmd .. " >/dev/null 2>&1") end
if not have("wrk") then
  print("\n## 5. HTTP server: skipped (wrk is not installed: apt-get install wrk)")
  return
end

local function serve_and_load(cmd, conns)
  local tmp = os.tmpname()
  os.execute(("%s > %s 2>&1 & echo $! > %s.pid"):format(cmd, tmp, tmp))
  local port
  for _ = 1, 100 do
    local f = io.open(tmp)
    local s = f and f:read("a") or ""
    if f then f:close() end
    port = s:match("PORT (%d+)")
    if port then break end
    os.execute("sleep 0.05")
  end
  local pidf = io.open(tmp .. ".pid")
  local pid = pidf:read("l")
  pidf:close()
  local rps = 0
  if port then
    local w = io.popen(("wrk -t1 -c%d -d%ds http://127.0.0.1:%s/ 2>&1"):format(conns, SECONDS, port))
    local out = w:read("a")
    w:close()
    rps = tonumber(out:match("Requests/sec:%s*([%d%.]+)")) or 0
    if out:match("Non%-2xx") or out:match("Socket errors") then
      io.write("    (wrk reported errors: ", (out:match("Socket errors:[^\n]*") or "non-2xx"), ")\n")
    end
  end
  os.execute("kill " .. pid .. " 2>/dev/null; sleep 0.2")
  os.remove(tmp)
  os.remove(tmp .. ".pid")
  return rps
end

local lua = "lua5.4 bench/http_server.lua"
local ROUNDS = tonumber(os.getenv("BENCH_HTTP_ROUNDS")) or 3
local configs = {}
for _, style in ipairs { "callbacks", "coroutines" } do
  for _, ctx in ipairs { "none", "asynclocal", "resource", "destroy" } do
    configs[#configs + 1] = { lang = "lua", style = style, ctx = ctx, cmd = ("%s %s %s"):format(lua, style, ctx) }
  end
end
if have("node") then
  for _, ctx in ipairs { "none", "als", "hooks" } do
    configs[#configs + 1] = { lang = "node", style = "callbacks", ctx = ctx, cmd = "node bench/node_server.js " .. ctx }
  end
end

local results = {}
for _, conns in ipairs { 50, 500 } do
  U.header(("5. HTTP server, %d connections: median of %d interleaved runs of %ds (requests/s, ratio to none)")
    :format(conns, ROUNDS, SECONDS))
  local samples = {}
  for _ = 1, ROUNDS do
    for i, c in ipairs(configs) do
      samples[i] = samples[i] or {}
      table.insert(samples[i], serve_and_load(c.cmd, conns))
    end
  end
  local base = {}
  for i, c in ipairs(configs) do
    table.sort(samples[i])
    local rps = samples[i][(#samples[i] + 1) // 2]
    local key = c.lang .. c.style
    if c.ctx == "none" then base[key] = rps end
    local r = (base[key] or 0) > 0 and rps / base[key] or 0
    local target = c.lang == "lua" and ((c.ctx == "asynclocal" and 0.97) or (c.ctx ~= "none" and 0.90)) or nil
    local verdict = target and ((r >= target) and ("  (target >= %.2f: met)"):format(target)
      or ("  (target >= %.2f: MISSED)"):format(target)) or ""
    print(("  %-4s %-10s %-11s %10.0f req/s   x%.3f%s"):format(c.lang, c.style, c.ctx, rps, r, verdict))
    results[#results + 1] = { conns = conns, lang = c.lang, style = c.style, ctx = c.ctx, rps = rps, ratio = r }
  end
end
return results
