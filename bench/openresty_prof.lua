-- Where the instructions of bench/openresty.lua's handlers go: a helper for
-- working on the OpenResty backend's cost (Lua 5.4, from the repository
-- root).
--
--   lua5.4 bench/openresty_prof.lua cg   CONFIG [N]   -- callgrind, per function
--   lua5.4 bench/openresty_prof.lua jitv CONFIG [N]   -- LuaJIT jit.v log
--   lua5.4 bench/openresty_prof.lua jitdump CONFIG [N] [flags]  -- jit.dump log
--
-- CONFIG is base, unused or lib (as in bench/openresty.lua), or any path of
-- bench/openresty_app.lua served with the library installed ("/floor" ...).
-- `cg` runs nginx under callgrind for N and 5N requests (N = 200) and prints
-- the self instructions per request of each function (difference of the two
-- runs / 4N), largest first; the raw outputs stay in /tmp/ah-prof/.  `jitv`
-- and `jitdump` serve N requests (N = 2000) with LuaJIT's trace log written
-- to /tmp/ah-prof/CONFIG.jitv (.jitdump) and print the trace aborts.
package.path = "./spec/?.lua;" .. package.path
local N = require("support.nginx")
local uv = require("luv")

local MODE, CONFIG = arg[1], arg[2] or "lib"
local OUT = "/tmp/ah-prof"
os.execute("mkdir -p " .. OUT)

local PATHS = { base = "/hand", unused = "/hand", lib = "/lib", floor_ctx = "/floor_ctx", floor_ctx_tab = "/floor_ctx_tab" }
local path = PATHS[CONFIG] or CONFIG
local install = CONFIG ~= "base"
local name = CONFIG:gsub("[^%w]", "_")

local function server()
  return ([[
    location = %s { content_by_lua_block { require("openresty_app").%s() } }
]]):format(path, path:sub(2))
end

local function http(extra)
  return ("init_by_lua_block { %s %s }"):format(extra or "", install and 'require("async_hooks").install()' or "")
end

local function serve(srv, n)
  for _ = 1, n do
    local st = srv:get(path, 30)
    assert(st == 200, "request failed")
  end
end

local function slurp(p)
  local f = assert(io.open(p))
  local s = f:read("a")
  f:close()
  return s
end

-- self instructions per function (callgrind_annotate, no inclusive)
local function per_function(file)
  local p = io.popen("callgrind_annotate --threshold=100 --inclusive=no " .. file .. " 2>/dev/null")
  local t = {}
  for line in p:lines() do
    local n, fn = line:match("^%s*([%d,]+)%s+%(%s*[%d.]+%%%)%s+(%S.*)$")
    if n and fn and not fn:match("PROGRAM TOTALS") then
      -- "file:function [object]": the same function comes with and without
      -- its file; keep the function (and the object's base name)
      local obj = fn:match("%[([^%]]*)%]%s*$")
      local f = fn:gsub("%s*%[[^%]]*%]%s*$", "")
      f = f:match("^<counts for unidentified lines in (.*)>$") or f:match("^[^:]*:(.*)$") or f
      f = f:gsub("'%d+$", "")
      if obj and f:match("^0x") then f = f .. "  " .. (obj:match("[^/]*$")) end
      fn = f
      t[fn] = (t[fn] or 0) + tonumber((n:gsub(",", "")))
    end
  end
  p:close()
  return t
end

-- AH_PROF_LIBPATH: a folder with a libluajit-5.1.so.2 built with symbols
-- (the same LuaJIT version), for function names in the table
local PRE = os.getenv("AH_PROF_LIBPATH") and ("env LD_LIBRARY_PATH=" .. os.getenv("AH_PROF_LIBPATH") .. " ") or ""

local function callgrind(n)
  local file = ("%s/%s.%d.cg"):format(OUT, name, n)
  if os.getenv("AH_PROF_REUSE") and io.open(file) then return file end -- analyse again
  local srv = N.start {
    http = http(), server = server(), lua_path = N.ROOT .. "/bench/?.lua", foreground = true, start_timeout = 120,
    prefix_cmd = (PRE .. "valgrind --tool=callgrind --dump-instr=yes --smc-check=all-non-file --callgrind-out-file=%s"):format(file),
  }
  local ok, err = pcall(serve, srv, n)
  uv.sleep(200)
  srv:stop()
  if not ok then error(err, 0) end
  return file
end

-- per function instructions per request of a config: {name -> n}, total
local function profile(n)
  local a, b = per_function(callgrind(n)), per_function(callgrind(5 * n))
  local t, total = {}, 0
  for fn, v in pairs(b) do
    local d = (v - (a[fn] or 0)) / (4 * n)
    total = total + d
    t[fn] = d
  end
  return t, total
end

if MODE == "cg" then
  -- CONFIG [N] [OTHER]: with OTHER, the difference CONFIG - OTHER
  local n = tonumber(arg[3]) or 200
  local t, total = profile(n)
  local o, ototal = {}, 0
  if arg[4] then
    CONFIG, path = arg[4], PATHS[arg[4]] or arg[4]
    install, name = CONFIG ~= "base", CONFIG:gsub("[^%w]", "_")
    o, ototal = profile(n)
  end
  local rows = {}
  local seen = {}
  for fn in pairs(t) do seen[fn] = true end
  for fn in pairs(o) do seen[fn] = true end
  for fn in pairs(seen) do
    local d = (t[fn] or 0) - (o[fn] or 0)
    if math.abs(d) >= 5 then rows[#rows + 1] = { fn, d, t[fn] or 0, o[fn] or 0 } end
  end
  table.sort(rows, function(x, y) return x[2] > y[2] end)
  print(("%s: %.0f instructions/request%s"):format(arg[2], total,
    arg[4] and (" (%s: %.0f, difference %+.0f)"):format(arg[4], ototal, total - ototal) or ""))
  for _, r in ipairs(rows) do print(("%8.0f %8.0f %8.0f  %s"):format(r[2], r[3], r[4], r[1])) end
elseif MODE == "jitv" or MODE == "jitdump" then
  local n = tonumber(arg[3]) or 2000
  local file = ("%s/%s.%s"):format(OUT, name, MODE)
  os.remove(file)
  local load = MODE == "jitv" and ('require("jit.v").on(%q)'):format(file)
    or ('require("jit.dump").on(%q, %q)'):format(arg[4] or "tbimT", file)
  local srv = N.start {
    http = http(load), server = server(), lua_path = N.ROOT .. "/bench/?.lua", foreground = true,
  }
  local ok, err = pcall(serve, srv, n)
  uv.sleep(200)
  srv:stop()
  if not ok then error(err, 0) end
  if srv.log:match("%[emerg%]") then io.stderr:write(srv.log:sub(1, 2000), "\n") end
  local s = slurp(file)
  local aborts = {}
  for line in s:gmatch("[^\n]+") do
    if line:match("abort") then aborts[line] = (aborts[line] or 0) + 1 end
  end
  for l, c in pairs(aborts) do print(("%4d  %s"):format(c, l)) end
  print("log: " .. file)
else
  io.stderr:write("usage: lua5.4 bench/openresty_prof.lua cg|jitv|jitdump CONFIG [N]\n")
  os.exit(2)
end
