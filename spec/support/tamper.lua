--- Tampering with the library's internals through the debug library: the
-- driver behind spec/15-tamper_spec.lua, run in its own process (a crash
-- must not take busted down).
--
--   lua5.4 spec/support/tamper.lua MODE FIRST [LAST [STRIDE]]
--
-- MODE: "plain" or "hooks" (four hooks enabled, init sees its resource);
-- STRIDE: run only the cases i with (i - 1) % STRIDE == 0 (a sample);
-- AH_TAMPER_LIST=1: print the list of cases instead.
-- The driver sets up some library state (values, coroutines suspended in
-- a scope, tracked luv handles and requests), finds every internal object
-- the debug library reaches (the C functions of the core and their
-- upvalues, the tables, userdata, metatables and user values reachable
-- from them, the library's registry entries), lists the tamperings in a
-- fixed order, and runs cases FIRST .. LAST of that list: each one changes
-- one thing, runs a workload that uses the whole library (every step
-- protected: a Lua error is fine), restores what it changed and runs the
-- workload again.  Before each case it prints "CASE i description", at
-- the end "DONE n"; the process then ends normally (lua_close runs every
-- finalizer).  The spec restarts the driver after the case that ended a
-- process and reports every case that crashed one.
local MODE, FIRST, LAST = arg[1] or "plain", tonumber(arg[2]) or 1, tonumber(arg[3]) or math.huge
local STRIDE = math.max(1, math.floor(tonumber(arg[4]) or 1))
local LIST = os.getenv("AH_TAMPER_LIST") == "1"

local uv = require("luv")
-- luv's own functions (taken before install()): they run the loop and close
-- what a case left behind even when the library's wrappers are damaged
local raw_run = uv.run
local raw_walk, raw_hclose, raw_is_closing = uv.walk, uv.close, uv.is_closing

local ah = require("async_hooks").install()
local core = require("async_hooks.core")
core.luv_flags(1 + 4) -- a callback's error neither ends the process nor prints

local dgetupvalue, dsetupvalue = debug.getupvalue, debug.setupvalue
local dgetuservalue, dsetuservalue = debug.getuservalue, debug.setuservalue
local dgetmetatable, dsetmetatable = debug.getmetatable, debug.setmetatable
local registry = debug.getregistry()

local function out(...)
  io.stdout:write(...)
  io.stdout:write("\n")
  io.stdout:flush()
end

-- ------------------------------------------------------------------ --
-- library state to find and to damage

local FIX = {}
FIX.v = ah.AsyncLocal.new { name = "v", default = "d" }
FIX.als = ah.AsyncLocalStorage.new()
FIX.v:set("x")
if MODE == "hooks" then
  FIX.hook = ah.createHook {
    init = function(id, type, trigger, resource) return id, type, trigger, resource end,
    before = function() end, after = function() end, destroy = function() end,
  }:enable()
end
-- a coroutine suspended inside a scope (its guard chain), one suspended
-- inside run(), a wrap closure
FIX.res = ah.AsyncResource.new("FIX")
FIX.co = coroutine.create(function()
  FIX.res:runInAsyncScope(function()
    while true do coroutine.yield(FIX.v:get()) end
  end)
end)
coroutine.resume(FIX.co)
FIX.co2 = coroutine.create(function()
  FIX.v:run("inner", function() while true do coroutine.yield() end end)
end)
coroutine.resume(FIX.co2)
FIX.wrap = coroutine.wrap(function() while true do coroutine.yield(FIX.v:get()) end end)
FIX.wrap()
-- tracked luv registrations: a handle re-armed (its record, then its
-- closure), a pending request (a quick record), a handle whose first
-- registration is a quick record
FIX.timer = uv.new_timer()
FIX.v:run("t", function()
  FIX.timer:start(100000, 0, function() end)
  FIX.timer:start(100000, 0, function() end)
  FIX.timer:start(100000, 0, function() end)
end)
FIX.timer2 = uv.new_timer()
FIX.v:run("t2", function() FIX.timer2:start(100000, 0, function() end) end)
FIX.idle = uv.new_idle()
FIX.v:run("i", function() FIX.idle:start(function() FIX.idle:stop() end) end)
FIX.async = uv.new_async(function() end) -- a record closure (luv takes only functions)
FIX.getter = FIX.v.get
for _, h in ipairs { FIX.timer, FIX.timer2, FIX.idle, FIX.async } do uv.unref(h) end
local FIXH = { [FIX.timer] = true, [FIX.timer2] = true, [FIX.idle] = true, [FIX.async] = true }
-- handles a case made (a luv function called with odd arguments) are closed
-- after it, so that none keeps the loop running
local function close_strays()
  pcall(raw_walk, function(h)
    if not FIXH[h] and not raw_is_closing(h) then pcall(raw_hclose, h) end
  end)
  pcall(raw_run, "nowait")
end
ah.executionAsyncResource()
-- keep everything made so far reachable from FIX (not collected while the
-- cases run)
FIX.tokens = {}

-- ------------------------------------------------------------------ --
-- finding the internals

-- the library's C code: its module's mapping in the address space (a light
-- C function's tostring is its address)
local lo, hi
do
  local path = package.searchpath("async_hooks.core", package.cpath)
  local real = path and io.popen("readlink -f '" .. path .. "'"):read("l")
  for line in io.lines("/proc/self/maps") do
    local a, b, file = line:match("^(%x+)%-(%x+) %S+ %S+ %S+ %S+%s+(.*)$")
    if file and real and file == real then
      a, b = tonumber(a, 16), tonumber(b, 16)
      lo = lo and math.min(lo, a) or a
      hi = hi and math.max(hi, b) or b
    end
  end
end
assert(lo, "the core's mapping not found")

local function address(f) return tonumber((tostring(f):match("0x(%x+)") or "0"), 16) end
local function is_cfunction(f) return type(f) == "function" and debug.getinfo(f, "S").what == "C" end
local function nups(f) return debug.getinfo(f, "u").nups end
-- a C function of the core: a light one at an address in the module, or a
-- closure (its tostring is the closure's address, not the code's) found
-- among the internals
local function light_ours(f) local a = address(f); return nups(f) == 0 and a >= lo and a < hi end

local names = {} -- object -> name (the first path that reached it)
local order = {} -- objects in the order found
local ours = {} -- internal objects: object -> kind
local function collectable(x)
  local t = type(x)
  return t == "table" or t == "function" or t == "userdata" or t == "thread"
end
for k, x in pairs(FIX) do names[x] = "FIX." .. k end

-- the user's own values (stored in frames, resources): never internals
local user = {}
for _, x in pairs(FIX) do user[x] = true end
user[ah] = true
user[FIX.v] = true

-- the library's state: the userdata among the shared upvalues of every
-- core function (core.stats has nothing else)
local STATE
for u = 1, nups(core.stats) do
  local _, val = dgetupvalue(core.stats, u)
  if type(val) == "userdata" then STATE = val; break end
end
assert(STATE ~= nil, "no state upvalue")
-- a closure of the core: one with the state among its upvalues, or one
-- found where the library keeps its callbacks with an internal upvalue
local function closure_ours(f)
  for u = 1, nups(f) do
    local _, val = dgetupvalue(f, u)
    if rawequal(val, STATE) then return true end
  end
  return false
end

local leaf = {} -- internal tables whose entries are the front end's
local queue = {}
local function add(x, name, kind)
  if not collectable(x) and type(x) ~= "userdata" then return end
  if ours[x] or user[x] then return end
  if type(x) == "thread" then return end
  if type(x) == "function" then
    if not is_cfunction(x) then return end
    if nups(x) == 0 and not light_ours(x) then return end
    if nups(x) > 0 and kind ~= "callback" and not closure_ours(x) then return end
  end
  ours[x] = kind or type(x)
  names[x] = names[x] or name
  order[#order + 1] = x
  queue[#queue + 1] = x
end

-- sorted keys of a table (integers, then strings, then named objects);
-- other keys (threads, unnamed objects) are skipped: their order would
-- change from process to process
local function sorted_keys(t)
  local ints, strs, objs = {}, {}, {}
  local k = nil
  repeat
    k = next(t, k)
    if k ~= nil then
      if math.type(k) == "integer" then ints[#ints + 1] = k
      elseif type(k) == "string" then strs[#strs + 1] = k
      elseif names[k] then objs[#objs + 1] = k end
    end
  until k == nil
  table.sort(ints)
  table.sort(strs)
  table.sort(objs, function(a, b) return names[a] < names[b] end)
  local all = {}
  for _, x in ipairs(ints) do all[#all + 1] = x end
  for _, x in ipairs(strs) do all[#all + 1] = x end
  for _, x in ipairs(objs) do all[#all + 1] = x end
  return all
end

local function keyname(k)
  if type(k) == "string" then return "." .. k end
  if math.type(k) == "integer" then return "[" .. k .. "]" end
  return "[" .. (names[k] or "?") .. "]"
end

-- walk: from C closures into their upvalues, from internal tables into
-- their entries (not into frames' values: the user's), from userdata into
-- their metatables and user values
local function walk()
  local i = 1
  while i <= #queue do
    local x = queue[i]
    i = i + 1
    local name = names[x]
    if type(x) == "function" then
      for u = 1, nups(x) do
        local _, val = dgetupvalue(x, u)
        if collectable(val) then add(val, name .. "^" .. u) end
      end
    elseif type(x) == "table" then
      local mt = dgetmetatable(x)
      if mt then add(mt, name .. "<mt>") end
      local frame = mt and rawget(mt, "__name") == "async_hooks.frame"
      if not frame and not leaf[x] then
        for _, k in ipairs(sorted_keys(x)) do
          local val = rawget(x, k)
          if collectable(k) and names[k] == nil then add(k, name .. "<key>") end
          if collectable(val) then add(val, name .. keyname(k)) end
        end
      end
    elseif type(x) == "userdata" then
      local mt = dgetmetatable(x)
      if mt then add(mt, name .. "<mt>") end
      local n = 1
      while true do
        local val, ok = dgetuservalue(x, n)
        if ok == false or ok == nil and val == nil and n > 8 then break end
        if ok == false then break end
        if collectable(val) then add(val, name .. "<uv" .. n .. ">") end
        n = n + 1
      end
    end
  end
end

-- roots: the core module, the front end's functions (their upvalues lead
-- to the core's closures), the patched luv functions and handle methods,
-- the library's registry entries and what luv keeps for tracked callbacks
local function add_from(t, name, depth)
  if depth > 3 or names[t] == false then return end
  for _, k in ipairs(sorted_keys(t)) do
    local val = rawget(t, k)
    if type(val) == "function" then
      if is_cfunction(val) then
        add(val, name .. keyname(k))
      else
        for u = 1, nups(val) do
          local _, up = dgetupvalue(val, u)
          if is_cfunction(up) then add(up, name .. keyname(k) .. "^" .. u) end
        end
      end
    elseif type(val) == "table" and not user[val] then
      add_from(val, name .. keyname(k), depth + 1)
    end
  end
end

leaf[core.persist()] = true
add(core, "core", "table")
walk()
add_from(ah, "ah", 0)
add_from(uv, "uv", 0)
for _, k in ipairs(sorted_keys(registry)) do
  local mt = rawget(registry, k)
  if type(k) == "string" and k:match("^uv_") and type(mt) == "table" and type(rawget(mt, "__index")) == "table" then
    add_from(rawget(mt, "__index"), "reg." .. k, 0)
  end
end
walk()
-- the library's registry entries (light userdata keys whose value is
-- internal) and luv's references to tracked callbacks (records, quick
-- records, record closures)
local REG = {}
do
  local k = nil
  repeat
    k = next(registry, k)
    if k ~= nil and type(k) == "userdata" and ours[rawget(registry, k)] then REG[#REG + 1] = k end
  until k == nil
  table.sort(REG, function(a, b) return names[rawget(registry, a)] < names[rawget(registry, b)] end)
end
local function internal_callback(val)
  if type(val) == "function" and is_cfunction(val) and nups(val) > 0 then
    for u = 1, nups(val) do
      local _, up = dgetupvalue(val, u)
      if ours[up] then return true end
    end
  elseif type(val) == "userdata" then
    return ours[dgetmetatable(val)] ~= nil
  end
  return false
end
for _, k in ipairs(sorted_keys(registry)) do
  local val = rawget(registry, k)
  if math.type(k) == "integer" and internal_callback(val) then add(val, "reg[" .. k .. "]", "callback") end
end
-- handles keep their record in their user value
for _, h in ipairs { FIX.timer, FIX.timer2, FIX.idle, FIX.async } do
  local val = dgetuservalue(h, 1)
  if collectable(val) then add(val, names[h] .. "<uv1>") end
end
walk()
-- the C functions the library calls protected (light, made on the fly):
-- seen by a call hook while the workload below runs once
local HIDDEN = {}
local called = {} -- the C functions the workload calls

-- ------------------------------------------------------------------ --
-- the workload

local function watchdog_run()
  -- runs the loop (the library's uv.run, else luv's) until what the
  -- workload started is done, for at most 10 ms (the fixtures' handles are
  -- not referenced: they do not keep the loop alive)
  for _ = 1, 10 do
    if not pcall(uv.run, "nowait") then pcall(raw_run, "nowait") end
    if not uv.loop_alive() then break end
    uv.sleep(1)
  end
end

local steps = {
  function() return FIX.v:get() end,
  function() return FIX.getter(FIX.v) end,
  function() FIX.v:set("y"); FIX.v:set("x") end,
  function() return FIX.v:run("r", function() return FIX.v:get() end) end,
  function() return FIX.als:run("s", function() return FIX.als:getStore() end) end,
  function() return ah.AsyncLocalStorage.snapshot()(function() return 1 end) end,
  function()
    local co = coroutine.create(function(a) coroutine.yield(a); return FIX.v:get() end)
    coroutine.resume(co, 1)
    coroutine.resume(co)
    return coroutine.close(co)
  end,
  function()
    local co = coroutine.create(function() coroutine.yield() end)
    coroutine.resume(co)
    return coroutine.close(co)
  end,
  function() local f = coroutine.wrap(function() coroutine.yield(1); return 2 end); f(); return f() end,
  function() return coroutine.resume(FIX.co) end,
  function() return coroutine.resume(FIX.co2) end,
  function() return FIX.wrap() end,
  function() return ah.executionAsyncId(), ah.triggerAsyncId(), ah.executionAsyncResource() end,
  function()
    local r = ah.AsyncResource.new("W")
    r:runInAsyncScope(function() return FIX.v:get(), ah.executionAsyncResource() end)
    r:emitDestroy()
  end,
  function() local h = ah.createHook { init = function() end, destroy = function() end }; h:enable(); h:disable() end,
  function()
    local t = uv.new_timer()
    FIX.v:run("w", function()
      t:start(0, 0, function() t:start(0, 0, function() t:close() end) end)
    end)
    uv.fs_stat(".", function() return ah.executionAsyncResource() end)
    FIX.v:run("q", function() uv.fs_stat(".", function() return FIX.v:get() end) end)
    local a
    a = uv.new_async(function() a:close() end)
    a:send()
    watchdog_run()
    if not t:is_closing() then t:close() end
    if not a:is_closing() then a:close() end
    watchdog_run()
  end,
  function() FIX.timer:start(100000, 0, function() end); FIX.timer2:stop() end,
  function() collectgarbage(); collectgarbage() end,
}

local function workload()
  for _, s in ipairs(steps) do pcall(s) end
end

-- the first run, under a call hook: the light C functions of the core that
-- it calls (protected helpers) and the closures it runs
do
  local seen = {}
  debug.sethook(function()
    local info = debug.getinfo(2, "f")
    local f = info and info.func
    if f and not seen[f] and is_cfunction(f) then
      seen[f] = true
      called[f] = true
      if nups(f) == 0 and light_ours(f) and not ours[f] then HIDDEN[#HIDDEN + 1] = f end
    end
  end, "c")
  workload()
  debug.sethook()
  table.sort(HIDDEN, function(a, b) return address(a) < address(b) end)
  for i, f in ipairs(HIDDEN) do add(f, "hidden#" .. i) end
  walk()
end

-- ------------------------------------------------------------------ --
-- the cases

local light = nil -- a light userdata that is not the library's
for _, k in ipairs(REG) do light = light or k end
local FOREIGN = { "nil", "42", "'x'", "{}", "true", "io.stdout", "print", "light", "thread" }
local function foreign(name)
  if name == "nil" then return nil end
  if name == "42" then return 42 end
  if name == "'x'" then return "x" end
  if name == "{}" then return {} end
  if name == "true" then return true end
  if name == "io.stdout" then return io.stdout end
  if name == "print" then return print end
  if name == "light" then return light end
  if name == "thread" then return coroutine.create(print) end
end

local ARGS = {
  { "(no argument)", function() return end },
  { "42", function() return 42 end },
  { "{}", function() return {} end },
  { "io.stdout", function() return io.stdout end },
  { "'x', 1, 2", function() return "x", 1, 2 end },
  { "{}, io.stdout, 3", function() return {}, io.stdout, 3 end },
  { "print, {}, 1, 2", function() return print, {}, 1, 2 end },
}

local cases = {}
local function case(desc, fn) cases[#cases + 1] = { desc, fn } end

-- the functions to damage: every one the workload calls, and one of each
-- other kind (the same upvalue layout: the luv wrappers share their code)
local function signature(f)
  local sig = { nups(f) }
  for u = 1, nups(f) do
    local _, val = dgetupvalue(f, u)
    local mt = type(val) == "userdata" and dgetmetatable(val)
    sig[#sig + 1] = type(val) .. (mt and names[mt] or "")
  end
  return table.concat(sig, ",")
end
local FUNCS, seen_sig = {}, {}
for _, f in ipairs(order) do
  if type(f) == "function" then
    local sig = nups(f) == 0 and tostring(f) or signature(f)
    if called[f] or not seen_sig[sig] then FUNCS[#FUNCS + 1] = f end
    seen_sig[sig] = true
  end
end
-- the userdata to pass around: one of each kind
local UDATA, seen_kind = {}, {}
for _, u in ipairs(order) do
  if type(u) == "userdata" then
    local mt, n = dgetmetatable(u), 0
    while select(2, dgetuservalue(u, n + 1)) do n = n + 1 end
    local kind = (mt and names[mt] or "-") .. "/" .. n
    if not seen_kind[kind] then UDATA[#UDATA + 1] = u end
    seen_kind[kind] = true
  end
end

-- every upvalue of every internal C function: foreign values, and the
-- other upvalues of the same function (a swap)
for _, f in ipairs(FUNCS) do
  do
    local n = nups(f)
    for u = 1, n do
      local function set(valfn, what)
        case(("setupvalue(%s, %d, %s)"):format(names[f], u, what), function()
          local _, old = dgetupvalue(f, u)
          dsetupvalue(f, u, valfn())
          for _, a in ipairs(ARGS) do pcall(f, a[2]()) end
          workload()
          dsetupvalue(f, u, old)
          workload()
        end)
      end
      for _, w in ipairs(FOREIGN) do set(function() return foreign(w) end, w) end
      for v = 1, n do
        if v ~= u then set(function() return select(2, dgetupvalue(f, v)) end, "upvalue " .. v) end
      end
    end
  end
end

-- every internal table: cleared (and its metatable taken away), and each
-- entry replaced
for _, t in ipairs(order) do
  if type(t) == "table" and t ~= core then
    case(("clear %s"):format(names[t]), function()
      local saved, mt = {}, dgetmetatable(t)
      for k, val in next, t do saved[k] = val end
      for k in pairs(saved) do rawset(t, k, nil) end
      dsetmetatable(t, nil)
      workload()
      for k, val in pairs(saved) do rawset(t, k, val) end
      dsetmetatable(t, mt)
      workload()
    end)
    for _, k in ipairs(sorted_keys(t)) do
      for _, w in ipairs { "nil", "42", "{}", "io.stdout", "light" } do
        case(("%s%s = %s"):format(names[t], keyname(k), w), function()
          local old = rawget(t, k)
          rawset(t, k, foreign(w))
          workload()
          rawset(t, k, old)
          workload()
        end)
      end
    end
  end
end

-- every internal userdata: its user values, its metatable
for _, u in ipairs(UDATA) do
  do
    local n = 1
    while true do
      local _, ok = dgetuservalue(u, n)
      if not ok then break end
      local un = n
      for _, w in ipairs { "nil", "42", "{}", "io.stdout" } do
        case(("setuservalue(%s, %s, %d)"):format(names[u], w, un), function()
          local old = dgetuservalue(u, un)
          dsetuservalue(u, foreign(w), un)
          workload()
          dsetuservalue(u, old, un)
          workload()
        end)
      end
      n = n + 1
    end
    for _, w in ipairs { "nil", "{}" } do
      case(("setmetatable(%s, %s)"):format(names[u], w), function()
        local old = dgetmetatable(u)
        dsetmetatable(u, foreign(w))
        workload()
        dsetmetatable(u, old)
        workload()
      end)
    end
  end
end

-- the library's registry entries
for _, k in ipairs(REG) do
  for _, w in ipairs { "nil", "42", "{}", "io.stdout" } do
    case(("registry[%s] = %s"):format(names[rawget(registry, k)], w), function()
      local old = rawget(registry, k)
      rawset(registry, k, foreign(w))
      workload()
      rawset(registry, k, old)
      workload()
    end)
  end
end

-- every internal function called with other values (its metamethods with a
-- self of another kind; the protected helpers with anything), and every
-- internal metatable given to another library's userdata
for _, f in ipairs(FUNCS) do
  do
    for _, a in ipairs(ARGS) do
      case(("%s(%s)"):format(names[f], a[1]), function()
        pcall(f, a[2]())
        workload()
      end)
    end
    for _, x in ipairs(UDATA) do
      do
        case(("%s(%s)"):format(names[f], names[x]), function()
          pcall(f, x, x, x)
          workload()
        end)
      end
    end
  end
end
for _, mt in ipairs(order) do
  if type(mt) == "table" and (rawget(mt, "__gc") or rawget(mt, "__close") or rawget(mt, "__call")) then
    case(("setmetatable(io.tmpfile(), %s) (collected, closed, called)"):format(names[mt]), function()
      local f = io.tmpfile()
      dsetmetatable(f, mt)
      pcall(f)
      pcall(load("local x <close> = ...", "=close"), f)
      f = nil -- luacheck: ignore 311
      collectgarbage()
      collectgarbage()
      workload()
    end)
  end
end

-- ------------------------------------------------------------------ --

if LIST then
  for i, c in ipairs(cases) do out(i, " ", c[2] and c[1]) end
  os.exit(0)
end
out("N ", #cases)
for i = FIRST, math.min(LAST, #cases) do
  if (i - 1) % STRIDE ~= 0 then goto next end
  out("CASE ", i, " ", cases[i][1])
  local ok, err = pcall(cases[i][2])
  if not ok then out("(case raised: ", tostring(err), ")") end
  close_strays()
  ::next::
end
out("DONE ", #cases)
