--- A small pure-Lua model of the SPEC semantics (frames, coroutine capture,
-- scopes that span yields, ids, hook events), written for the differential
-- test: same interface as the real adapter in spec/support/real.lua.
-- Ids are symbolic ("top", "co1", "ar2", "tm3"); frames are plain tables.
local M = {}

--- A fresh model.  `hooks_on` tells whether the toggled recording hook is
-- enabled; `events` collects what it would receive.
function M.new(nlocals)
  local raw = { create = coroutine.create, resume = coroutine.resume, yield = coroutine.yield,
    running = coroutine.running, status = coroutine.status }
  local m = { events = {}, destroyed = {}, hooks_on = false, counter = 0 }
  local NILV = {}
  local EMPTY = {}
  -- per-thread state: {id, trigger, frame, scopes = {open scope records}}
  local main = { id = "top", trigger = "root", frame = EMPTY, scopes = {} }
  local threads = setmetatable({}, { __mode = "k" })
  local timers = {}

  local function cur()
    local co, ismain = raw.running()
    if ismain or co == nil then return main end -- (5.1 and LuaJIT: nil on the main thread)
    return threads[co]
  end
  local function emit(kind, id)
    if m.hooks_on then m.events[#m.events + 1] = kind .. " " .. id end
  end
  local function fresh(prefix)
    m.counter = m.counter + 1
    return prefix .. m.counter
  end
  local function with(frame, k, v)
    local n = {}
    for k2, v2 in pairs(frame) do n[k2] = v2 end
    n[k] = (v == nil) and NILV or v
    return n
  end

  function m.get(i)
    local v = cur().frame[i]
    if v == NILV then return nil end
    return v
  end
  function m.set(i, v)
    local t = cur()
    t.frame = with(t.frame, i, v)
  end
  local function finish(t, frame, ok, ...)
    t.frame = frame
    if not ok then error((...), 0) end
    return ...
  end
  function m.run(i, v, f)
    local t = cur()
    local prev = t.frame
    t.frame = with(prev, i, v)
    return finish(t, prev, pcall(f))
  end
  function m.snap() return cur().frame end
  function m.snaprun(frame, f)
    local t = cur()
    local prev = t.frame
    t.frame = frame
    return finish(t, prev, pcall(f))
  end
  function m.ar_new()
    local t = cur()
    return { id = fresh("ar"), trigger = t.id, frame = t.frame }
  end
  function m.ar_run(ar, f)
    local t = cur()
    local pid, ptrig, pframe = t.id, t.trigger, t.frame
    local scope = { id = ar.id, out = false, ar = ar }
    t.id, t.trigger, t.frame = ar.id, ar.trigger, ar.frame
    t.scopes[#t.scopes + 1] = scope
    emit("before", ar.id)
    local function close(ok, ...)
      table.remove(t.scopes)
      if not scope.out then emit("after", ar.id) end
      t.id, t.trigger, t.frame = pid, ptrig, pframe
      if not ok then error((...), 0) end
      return ...
    end
    return close(pcall(f))
  end
  function m.ar_destroy(ar)
    if not ar.destroyed then
      ar.destroyed = true
      m.destroyed[ar.id] = true
    end
  end
  function m.co_new(f)
    local t = cur()
    local co = raw.create(f)
    local id = fresh("co")
    threads[co] = { id = id, trigger = t.id, frame = t.frame, scopes = {}, base = id, base_trigger = t.id }
    return co
  end
  function m.co_resume(co)
    if raw.status(co) ~= "suspended" then return false end
    local th = threads[co]
    emit("before", th.base)
    -- (a scope whose resource's destroy was asked for stays out)
    for _, s in ipairs(th.scopes) do
      if s.out and m.hooks_on and not s.ar.destroyed then emit("before", s.id); s.out = false end
    end
    local ok = raw.resume(co)
    local dead = raw.status(co) == "dead"
    -- every slice's end marks the open scopes out, with hooks or without
    -- (emit records only while the hook is on): a hook enabled before the
    -- next resume gets their before there, and no after without a before
    for k = #th.scopes, 1, -1 do
      local s = th.scopes[k]
      if not s.out then emit("after", s.id); s.out = true end
    end
    emit("after", th.base)
    if dead then m.destroyed[th.base] = true end
    return ok
  end
  m.yield = raw.yield
  function m.timer(f)
    local t = cur()
    timers[#timers + 1] = { id = fresh("tm"), trigger = t.id, frame = t.frame, f = f }
  end
  function m.finish()
    local i = 1
    while timers[i] do
      local tm = timers[i]
      local pid, ptrig, pframe = main.id, main.trigger, main.frame
      main.id, main.trigger, main.frame = tm.id, tm.trigger, tm.frame
      emit("before", tm.id)
      tm.f()
      emit("after", tm.id)
      main.id, main.trigger, main.frame = pid, ptrig, pframe
      m.destroyed[tm.id] = true -- the callback closes its handle
      i = i + 1
    end
    timers = {}
  end
  function m.hook(on) m.hooks_on = on end
  function m.exec_id() return cur().id end
  function m.trigger_id() return cur().trigger end
  m.nlocals = nlocals
  return m
end

return M
