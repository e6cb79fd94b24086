-- The handlers of the OpenResty specs (loaded inside nginx; LuaJIT).
-- Each handler answers with a short text the spec compares.
local ah = require("async_hooks")
local AsyncLocal, Snapshot = ah.AsyncLocal, ah.Snapshot

local A = {}

local rid = AsyncLocal.new { name = "rid" }
local other = AsyncLocal.new { name = "other", default = "dflt" }
A.rid, A.other = rid, other

local concat, tostring = table.concat, tostring

local function say(t) ngx.say(concat(t, " ")) end
local function arg(name) return ngx.var["arg_" .. name] end
local function s(v) return tostring(v) end

-- a tiny sleep, different per request, so that requests interleave
local function jitter(id)
  ngx.sleep((tonumber(id) or 0) % 7 * 0.002)
end

--- set, sleep, then read back through every carrier
function A.isolation()
  local id = arg("id")
  local before = rid:get()
  rid:set(id)
  jitter(id)
  local out = { s(before), rid:get() }
  -- coroutine (created after the sleep)
  local co = coroutine.create(function()
    ngx.sleep(0.001)
    return rid:get()
  end)
  local _, r = coroutine.resume(co)
  while coroutine.status(co) ~= "dead" do _, r = coroutine.resume(co) end
  out[#out + 1] = s(r)
  -- light thread
  local th = ngx.thread.spawn(function()
    jitter(id)
    return rid:get()
  end)
  local _, got = ngx.thread.wait(th)
  out[#out + 1] = s(got)
  -- timer hand-off, read back through a shared dict
  local dict = ngx.shared.ah
  local key = "iso" .. id
  ngx.timer.at(0, function()
    jitter(id)
    dict:set(key, rid:get())
  end)
  for _ = 1, 200 do
    if dict:get(key) then break end
    ngx.sleep(0.002)
  end
  out[#out + 1] = s(dict:get(key))
  dict:delete(key)
  out[#out + 1] = rid:get()
  say(out)
end

--- rewrite/access/content/log share the request's context
function A.phase_rewrite()
  ngx.ctx.user_field = "kept" -- user data in ngx.ctx lives next to ours
  rid:set("r-" .. arg("id"))
end

function A.phase_access()
  ngx.sleep(0.001)
  other:set(rid:get() .. "+a")
end

function A.phase_content()
  ngx.sleep(0.001)
  say { rid:get(), other:get(), ngx.ctx.user_field }
end

function A.phase_header_filter()
  ngx.header["X-Rid"] = rid:get()
end

function A.phase_log()
  ngx.shared.ah:set("log" .. arg("id"), rid:get() .. "|" .. other:get())
end

function A.phase_read()
  say { s(ngx.shared.ah:get("log" .. arg("id"))) }
end

--- sequential requests on recycled threads: each starts empty
local function seen(d)
  return d:incr("seen" .. tostring(coroutine.running()), 1, 0) > 1
end

function A.recycle()
  local id = arg("id")
  local d = ngx.shared.ah
  local out = { s(rid:get()), s(other:get()) }
  d:incr("entries", 1, 0)
  if seen(d) then d:incr("reused", 1, 0) end
  rid:set(id)
  other:set(id)
  -- a light thread, a coroutine and a timer that set values and end: their
  -- Lua threads go back to ngx_lua's cache too
  local th = ngx.thread.spawn(function() seen(d); rid:set("thread-" .. id); ngx.sleep(0) end)
  ngx.thread.wait(th)
  coroutine.wrap(function() seen(d); rid:set("co-" .. id) end)()
  ngx.timer.at(0, function() seen(d); rid:set("timer-" .. id) end)
  out[#out + 1] = rid:get()
  say(out)
end

function A.recycle_stats()
  local d = ngx.shared.ah
  say { s(d:get("entries")), s(d:get("reused")) }
end

--- coroutines: capture at creation, own context per coroutine
function A.coroutines()
  local out = {}
  rid:set("outer")
  local co = coroutine.create(function(a)
    out[#out + 1] = rid:get() .. a            -- captured at create
    rid:set("inner")
    local b = coroutine.yield()
    out[#out + 1] = rid:get() .. b            -- own value across the yield
    ngx.sleep(0.001)
    out[#out + 1] = rid:get()                 -- and across ngx.sleep
    return "done"
  end)
  rid:set("changed")                          -- after create: not seen inside
  coroutine.resume(co, 1)
  out[#out + 1] = rid:get()                   -- inner set does not leak
  coroutine.resume(co, 2)
  out[#out + 1] = rid:get()
  local f = coroutine.wrap(function()
    out[#out + 1] = rid:get()
    coroutine.yield()
    out[#out + 1] = rid:get()
  end)
  rid:set("late")
  f()
  f()
  -- nested: a coroutine made inside a coroutine captures the inner value
  local outer = coroutine.wrap(function()
    rid:set("level1")
    local inner = coroutine.wrap(function() return rid:get() end)
    rid:set("level1b")
    return inner()
  end)
  out[#out + 1] = outer()
  out[#out + 1] = rid:get()
  -- the drop-in library works the same without install
  local co2 = ah.coroutine.create(function() return rid:get() end)
  rid:set("after-dropin")
  out[#out + 1] = select(2, coroutine.resume(co2))
  say(out)
end

--- light threads: capture at spawn, isolation while both sleep
function A.threads()
  local out = {}
  rid:set("parent")
  local t1 = ngx.thread.spawn(function(x)
    local a = rid:get()
    rid:set("t1")
    ngx.sleep(0.01)
    return a .. x, rid:get()
  end, "!")
  rid:set("parent2")
  local t2 = ngx.thread.spawn(function()
    ngx.sleep(0.005)
    local a = rid:get()
    rid:set("t2")
    ngx.sleep(0.01)
    return a, rid:get()
  end)
  ngx.sleep(0.007)
  out[#out + 1] = rid:get()
  local _, a1, b1 = ngx.thread.wait(t1)
  local _, a2, b2 = ngx.thread.wait(t2)
  out[#out + 1] = a1
  out[#out + 1] = b1
  out[#out + 1] = a2
  out[#out + 1] = b2
  out[#out + 1] = rid:get()
  -- a killed thread leaves nothing behind
  local t3 = ngx.thread.spawn(function() rid:set("t3"); ngx.sleep(1) end)
  ngx.thread.kill(t3)
  out[#out + 1] = rid:get()
  say(out)
end

--- timers: ngx.timer.at and ngx.timer.every capture at registration
function A.timers()
  local d = ngx.shared.ah
  local id = arg("id")
  rid:set("at-" .. id)
  ngx.timer.at(0.001, function(premature, x, y)
    d:set("t_at" .. id, rid:get() .. ":" .. x .. y .. ":" .. tostring(premature))
    rid:set("leak")
    -- a timer made inside a timer captures the timer's context
    ngx.timer.at(0, function() d:set("t_nested" .. id, rid:get()) end)
  end, "x", "y")
  rid:set("every-" .. id)
  local runs = 0
  local got = {}
  local ok = ngx.timer.every(0.002, function(premature)
    if premature then return end
    runs = runs + 1
    if runs > 3 then return end
    got[runs] = rid:get()
    rid:set("leak" .. runs)       -- must not reach the next run
    if runs == 3 then d:set("t_every" .. id, concat(got, ",")) end
  end)
  rid:set("after")
  for _ = 1, 500 do
    if d:get("t_every" .. id) and d:get("t_nested" .. id) then break end
    ngx.sleep(0.002)
  end
  say { s(ok), s(d:get("t_at" .. id)), s(d:get("t_nested" .. id)), s(d:get("t_every" .. id)), rid:get() }
end

--- a timer callback that raises leaves no record behind for later timers
--- (ngx_lua recycles the fake request's memory and the Lua thread)
function A.timer_error()
  local d = ngx.shared.ah
  local id = arg("id")
  rid:set("err-" .. id)
  ngx.timer.at(0, function()
    d:set("terr" .. id, rid:get())
    error("expected-boom " .. id)
  end)
  for _ = 1, 200 do
    if d:get("terr" .. id) then break end
    ngx.sleep(0.001)
  end
  say { s(d:get("terr" .. id)) }
end

function A.timer_after_error()
  local d = ngx.shared.ah
  local id = arg("id")
  local left = 10
  for _ = 1, 10 do
    ngx.timer.at(0, function()
      if rid:get() ~= nil then d:incr("stale", 1, 0) end
      left = left - 1
    end)
  end
  for _ = 1, 500 do
    if left == 0 then break end
    ngx.sleep(0.001)
  end
  say { s(left), s(d:get("stale") or 0), s(rid:get()), id }
end

--- timers that run after a callback raised or called ngx.exit (ngx_lua
--- recycles the fake request's memory and the Lua thread) see nothing of
--- it, also when they were registered unobservably (empty frame, no hook:
--- not wrapped) or through ngx.timer.at/every saved before install()
function A.timer_stale()
  local d = ngx.shared.ah
  local id = arg("id")
  local originals = rawget(_G, "ORIGINALS") -- set by the spec's init_by_lua, before install()
  local saved_at, saved_every = originals[6], originals[7]
  local n, left = 0, 0
  local function probe(premature)
    if premature then return end
    local v, trig = rid:get(), ah.triggerAsyncId()
    if v ~= nil or trig ~= 1 then d:incr("stale" .. id, 1, 0) end
    rid:set("mine") -- must stay with this run
    n = n + 1
    left = left - 1
  end
  -- registered before anything else: no hook, the empty frame
  for _ = 1, 4 do
    left = left + 1
    ngx.timer.at(0.02, probe)
    left = left + 1
    saved_at(0.02, probe)
  end
  local every = 0
  local ok = saved_every(0.005, function(premature)
    if premature or every >= 6 then return end
    every = every + 1
    probe()
  end)
  left = left + 6
  rid:set("secret-" .. id)
  other:set("other-" .. id)
  ngx.timer.at(0, function() error("expected-boom stale " .. id) end)
  ngx.timer.at(0, function() ngx.exit(0) end)
  ngx.timer.at(0.001, function() rid:set("x"); error("expected-boom stale2 " .. id) end)
  for _ = 1, 500 do
    if left == 0 then break end
    ngx.sleep(0.002)
  end
  say { s(ok), s(n), s(left), s(d:get("stale" .. id) or 0), rid:get() }
end

--- the request's record is its ngx.ctx: the user's own keys (even named
--- like the record's fields) neither disturb it nor get touched, also when
--- ngx.ctx has an __index metatable
function A.ctx_keys()
  local ctx = ngx.ctx
  ctx.frame, ctx.id, ctx.trigger, ctx.res, ctx.n, ctx.co = "f", "i", "t", "r", "n", "c"
  setmetatable(ctx, { __index = function(_, k) return "idx-" .. tostring(k) end })
  rid:set("v")
  local id, trig, res = ah.executionAsyncId(), ah.triggerAsyncId(), ah.executionAsyncResource()
  local th = ngx.thread.spawn(function() ngx.sleep(0.001); return rid:get(), ah.triggerAsyncId() == id end)
  local _, tv, tt = ngx.thread.wait(th)
  local user = concat({ ctx.frame, ctx.id, ctx.trigger, ctx.res, ctx.n, ctx.co, ctx.other }, ",")
  say { rid:get(), type(id), s(trig), type(res), s(res == ah.executionAsyncResource()), s(tv), s(tt), user }
end

--- the library reuses the record of a timer callback that returned: each
--- run still starts in its own captured frame with its own id and resource,
--- and a light thread left running by an earlier callback (whose record is
--- not reused) keeps its context
function A.timer_reuse()
  local id = arg("id")
  local n, done = 6, 0
  local ok, ids, ress, thread = 0, {}, {}, nil
  for i = 1, n do
    rid:set(id .. "-" .. i)
    ngx.timer.at(0, function()
      if rid:get() == id .. "-" .. i and other:get() == "dflt" then ok = ok + 1 end
      ids[ah.executionAsyncId()] = true
      ress[ah.executionAsyncResource()] = true
      rid:set("leak" .. i)
      other:set("leak" .. i)
      if i == 1 then
        ngx.thread.spawn(function() ngx.sleep(0.02); thread = rid:get() .. "/" .. other:get() end)
      end
      done = done + 1
    end)
    for _ = 1, 500 do -- one after the other: the next may take this one's record
      if done == i then break end
      ngx.sleep(0.001)
    end
  end
  for _ = 1, 500 do
    if thread then break end
    ngx.sleep(0.001)
  end
  local nids, nres = 0, 0
  for _ in pairs(ids) do nids = nids + 1 end
  for _ in pairs(ress) do nres = nres + 1 end
  say { s(ok), s(nids), s(nres), s(thread), rid:get() }
end

--- scopes restore on return and on error and keep per-thread values across
--- yields
function A.scopes()
  local out = {}
  rid:set("base")
  out[#out + 1] = rid:run("in", function(a) return rid:get() .. a end, "!")
  out[#out + 1] = rid:get()
  local e = {}
  local _, ok, err
  ok, err = pcall(rid.run, rid, "in", function() other:set("x"); error(e) end)
  out[#out + 1] = s(ok) .. s(err == e) .. rid:get() .. other:get()
  _, err = pcall(rid.run, rid, "in", function() error("plain", 0) end)
  out[#out + 1] = s(err)
  -- yields inside a scope: a light thread sleeps in rid:run while the parent
  -- (and another thread) keep their own values
  local t = ngx.thread.spawn(function()
    return rid:run("scoped", function()
      ngx.sleep(0.01)
      local v = rid:get()
      ngx.sleep(0)
      return v .. "/" .. rid:get()
    end) .. "/" .. rid:get()
  end)
  local t2 = ngx.thread.spawn(function()
    ngx.sleep(0.003)
    return rid:get()
  end)
  -- a cosocket round trip (to this server) inside a scope
  local t3 = ngx.thread.spawn(function()
    return rid:run("sock", function()
      local sock = ngx.socket.tcp()
      assert(sock:connect("127.0.0.1", tonumber(ngx.var.server_port)))
      assert(sock:send("GET /__ah_ping HTTP/1.0\r\nHost: x\r\n\r\n"))
      local resp = sock:receive("*a")
      sock:close()
      return rid:get() .. ":" .. resp:match("^HTTP/1%.%d (%d+)")
    end) .. "/" .. rid:get()
  end)
  ngx.sleep(0.005)
  out[#out + 1] = rid:get()
  out[#out + 1] = select(2, ngx.thread.wait(t))
  out[#out + 1] = select(2, ngx.thread.wait(t2))
  out[#out + 1] = select(2, ngx.thread.wait(t3))
  -- the error of a scope that slept
  _, err = pcall(rid.run, rid, "slept", function() ngx.sleep(0.001); error("late", 0) end)
  out[#out + 1] = s(err) .. rid:get()
  -- Snapshot, AsyncLocalStorage, Snapshot.empty
  local snap = Snapshot.new()
  rid:set("later")
  out[#out + 1] = snap:run(function() ngx.sleep(0); return rid:get() end)
  out[#out + 1] = Snapshot.empty():run(function() return s(rid:get()) .. other:get() end)
  out[#out + 1] = rid:get()
  local als = ah.AsyncLocalStorage.new()
  out[#out + 1] = als:run("store", function() return als:getStore() end)
  out[#out + 1] = s(als:getStore())
  local bound = Snapshot.wrap(function() return rid:get() end)
  rid:set("x2")
  out[#out + 1] = bound()
  -- disable: the default everywhere, set works again
  local tmp = AsyncLocal.new { default = "d" }
  tmp:set(1)
  local snap2 = Snapshot.new()
  tmp:disable()
  out[#out + 1] = tmp:get() .. snap2:run(function() return tmp:get() end)
  tmp:set(2)
  out[#out + 1] = s(tmp:get())
  say(out)
end

--- hook events of coroutines, light threads, timers, AsyncResource
function A.hooks()
  local log, mine = {}, {}
  local hook = ah.createHook {
    init = function(id, type_, trigger, res)
      mine[id] = true
      log[#log + 1] = ("init %s %s"):format(type_, type(res))
    end,
    before = function(id) if mine[id] then log[#log + 1] = "before" end end,
    after = function(id) if mine[id] then log[#log + 1] = "after" end end,
    destroy = function(id) if mine[id] then log[#log + 1] = "destroy" end end,
  }:enable()
  local out = {}
  local ids = {}
  local function mark(tag)
    log[#log + 1] = tag
  end
  -- coroutine
  local parent = ah.executionAsyncId()
  local co = coroutine.create(function()
    ids.co = ah.executionAsyncId()
    ids.co_trigger = ah.triggerAsyncId()
    ids.co_res = ah.executionAsyncResource().thread
    coroutine.yield()
  end)
  mark("co")
  coroutine.resume(co)
  coroutine.resume(co)
  out[#out + 1] = s(ids.co_trigger == parent) .. s(ids.co_res == co) .. s(ids.co ~= parent)
  -- light thread
  mark("thread")
  local t = ngx.thread.spawn(function() ngx.sleep(0); return ah.executionAsyncId() end)
  local _, tid = ngx.thread.wait(t)
  out[#out + 1] = s(tid ~= parent)
  -- timer
  mark("timer")
  local done = false
  ngx.timer.at(0, function() done = ah.triggerAsyncId() end)
  for _ = 1, 200 do
    if done then break end
    ngx.sleep(0.001)
  end
  out[#out + 1] = s(done == parent)
  -- AsyncResource
  mark("resource")
  local r = ah.AsyncResource.new("mine", { requireManualDestroy = true })
  rid:set("outside")
  local got = r:runInAsyncScope(function() ngx.sleep(0); return ah.executionAsyncResource() == r, rid:get() end)
  r:emitDestroy()
  r:emitDestroy()
  out[#out + 1] = s(got) .. s(ah.executionAsyncId() == parent)
  -- a resource collected by the GC: destroy is queued by its finalizer and
  -- delivered at the next dispatch
  mark("gc")
  do local _ = ah.AsyncResource.new("collected") end
  collectgarbage()
  collectgarbage()
  ah.AsyncResource.new("next", { requireManualDestroy = true }):emitDestroy()
  hook:disable()
  out[#out + 1] = concat(log, ",")
  ngx.say(concat(out, "\n"))
end

--- destroys queued by finalizers (AsyncResources left to the GC) while the
--- library queues and delivers its own (coroutines that end), under load:
--- none lost, none delivered twice, never destroy(nil)
local dstress
function A.destroy_begin()
  local st = { live = {}, inits = 0, destroys = 0, nils = 0, twice = 0 }
  st.hook = ah.createHook {
    init = function(id, type_)
      if type_ == "gc" or type_ == "coroutine" or type_ == "flush" then
        st.inits = st.inits + 1
        st.live[id] = true
      end
    end,
    destroy = function(id)
      if id == nil then st.nils = st.nils + 1; return end
      if st.live[id] == nil then return end
      if st.live[id] == false then st.twice = st.twice + 1; return end
      st.destroys = st.destroys + 1
      st.live[id] = false
    end,
  }:enable()
  dstress = st
  ngx.say("ok")
end

local noop = function() end
function A.destroy_work()
  ah.AsyncResource.new("gc")
  coroutine.wrap(noop)()
  ngx.say("ok")
end

function A.destroy_end()
  local st = dstress
  collectgarbage()
  collectgarbage()
  ah.AsyncResource.new("flush", { requireManualDestroy = true }):emitDestroy()
  st.hook:disable()
  local left = 0
  for _, v in pairs(st.live) do if v then left = left + 1 end end
  say { s(st.inits > 1000), s(st.inits == st.destroys), s(left), s(st.nils), s(st.twice) }
end

--- a scope open in a library coroutine across coroutine.yield: `after` at
--- the yield (innermost first, then the coroutine's), `before` again at the
--- resume (the coroutine's, then outermost first); the resumer runs in its
--- own context meanwhile
function A.scope_yield()
  local log, names = {}, {}
  local hook = ah.createHook {
    init = function(id, t) names[id] = t end,
    before = function(id) if names[id] then log[#log + 1] = "before(" .. names[id] .. ")" end end,
    after = function(id) if names[id] then log[#log + 1] = "after(" .. names[id] .. ")" end end,
  }:enable()
  local outer = ah.AsyncResource.new("outer", { requireManualDestroy = true })
  local inner = ah.AsyncResource.new("inner", { requireManualDestroy = true })
  local co = coroutine.create(function()
    outer:runInAsyncScope(function()
      inner:runInAsyncScope(function()
        coroutine.yield()
        log[#log + 1] = "in:" .. (ah.executionAsyncId() == inner:asyncId() and "inner" or "?")
      end)
      coroutine.yield()
      log[#log + 1] = "in:" .. (ah.executionAsyncId() == outer:asyncId() and "outer" or "?")
    end)
  end)
  local mine = ah.executionAsyncId()
  for _ = 1, 3 do
    coroutine.resume(co)
    log[#log + 1] = "|" .. (ah.executionAsyncId() == mine and "resumer" or "?") .. "|"
  end
  hook:disable()
  say(log)
end

--- ngx.exit inside scopes abandons the handler's thread without unwinding:
--- the next phase finds the request's context as it was before the scopes
--- (value, ids) and the abandoned runInAsyncScope gets its `after`;
--- header filters that run inside a handler's scope (inside ngx.say) still
--- see it
local exit_log
function A.exitok_rewrite()
  rid:set("req-" .. arg("id"))
  ngx.ctx.ids = ah.executionAsyncId() .. "/" .. ah.triggerAsyncId()
  exit_log = {}
  local hook = ah.createHook {
    before = function(id) if id == ngx.ctx.res_id then exit_log[#exit_log + 1] = "before" end end,
    after = function(id) if id == ngx.ctx.res_id then exit_log[#exit_log + 1] = "after" end end,
  }:enable()
  ngx.ctx.hook = hook
end

function A.exitok_access()
  local r = ah.AsyncResource.new("auth", { requireManualDestroy = true })
  ngx.ctx.res_id = r:asyncId()
  rid:run("admin", function()
    r:runInAsyncScope(function()
      other:set("in-scope")
      ngx.exit(ngx.OK) -- go on with the content phase
    end)
  end)
end

function A.exitok_content()
  local ids = ah.executionAsyncId() .. "/" .. ah.triggerAsyncId()
  local line = concat({ rid:get(), other:get(), s(ids == ngx.ctx.ids), concat(exit_log, ",") }, " ")
  ngx.ctx.hook:disable()
  rid:run("in-content", function()
    ngx.say(line) -- the header filter runs in here
    ngx.exit(ngx.HTTP_OK)
  end)
end

function A.exitok_log()
  ngx.shared.ah:set("exitok" .. arg("id"), rid:get() .. " " .. other:get())
end

function A.exitok_read()
  say { s(ngx.shared.ah:get("exitok" .. arg("id"))) }
end

--- a subrequest given the parent's ngx.ctx, inside the parent's scopes
local shared_seen = {}
function A.sharedctx_parent()
  local als = ah.AsyncLocalStorage.new()
  A.shared_als = als
  local r = ah.AsyncResource.new("P", { requireManualDestroy = true })
  local afters = 0
  local hook = ah.createHook { after = function(id) if id == r:asyncId() then afters = afters + 1 end end }:enable()
  local out
  r:runInAsyncScope(function()
    als:run("A", function()
      shared_seen = {}
      ngx.location.capture("/sharedctx_sub", { ctx = ngx.ctx })
      out = "sub:" .. concat(shared_seen, ",") .. " parent:" .. s(als:getStore()) .. ","
        .. (ah.executionAsyncId() == r:asyncId() and "same" or "other")
    end)
  end)
  hook:disable()
  say { out, "afters:" .. afters }
end
function A.sharedctx_sub_rewrite() shared_seen[#shared_seen + 1] = s(A.shared_als:getStore()) end
function A.sharedctx_sub_content()
  shared_seen[#shared_seen + 1] = s(A.shared_als:getStore())
  ngx.say("ok")
end

--- a light thread killed while suspended inside runInAsyncScope gets its
--- own destroy, not the scope's id
function A.kill_in_scope()
  local names, log = {}, {}
  local hook = ah.createHook {
    init = function(id, t) names[id] = t end,
    destroy = function(id) if names[id] then log[#log + 1] = names[id] end end,
  }:enable()
  local r = ah.AsyncResource.new("res", { requireManualDestroy = true })
  local th = ngx.thread.spawn(function() r:runInAsyncScope(function() ngx.sleep(1) end) end)
  ngx.sleep(0.01)
  local ok = ngx.thread.kill(th)
  local c = coroutine.wrap(function() end) -- a flush point
  c()
  hook:disable()
  say { s(ok), concat(log, ",") }
end

--- top-level ids inside a request and install state
function A.ids()
  local a, b = ah.executionAsyncId(), ah.executionAsyncId()
  local r1, r2 = ah.executionAsyncResource(), ah.executionAsyncResource()
  say { s(a == b), s(a > 1), s(ah.triggerAsyncId()), s(r1 == r2), ah.backend, s(ah.installed()) }
end

--- soak: set, yield, hand over to a timer, check everything matches
local n = 0
function A.soak()
  n = n + 1
  local id = ngx.worker.pid() .. "-" .. n
  local d = ngx.shared.ah
  rid:set(id)
  ngx.sleep(0)
  if rid:get() ~= id then d:incr("soak_bad", 1, 0) end
  ngx.timer.at(0, function()
    if rid:get() ~= id then d:incr("soak_bad", 1, 0) end
    d:incr("soak_timers", 1, 0)
  end)
  local t = ngx.thread.spawn(function()
    ngx.sleep(0)
    return rid:get()
  end)
  local _, got = ngx.thread.wait(t)
  if got ~= id then d:incr("soak_bad", 1, 0) end
  if rid:get() ~= id then d:incr("soak_bad", 1, 0) end
  d:incr("soak_requests", 1, 0)
  ngx.say("ok")
end

function A.soak_stats()
  local d = ngx.shared.ah
  say { s(d:get("soak_requests")), s(d:get("soak_timers")), s(d:get("soak_bad") or 0) }
end

-- the handlers that compare with ngx_lua alone, and the internals check
require("ah_ngx_same")(A)
require("ah_ngx_internals")(A)

return A
