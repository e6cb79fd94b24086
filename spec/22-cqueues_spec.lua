-- cqueues: threads made by cq:wrap (and coroutines given to cq:attach)
-- carry their creator's context, are resources with their creator as
-- trigger, queued destroys arrive at the next step; install before or after
-- require("cqueues"), uninstall restores cqueues' methods; the lua-http
-- example under concurrent requests.  Each case runs in a fresh process.
local H = require("helpers")

-- lua-http is packaged for Lua 5.1-5.3 on Debian (pure Lua, works on 5.4)
local HTTP_PATH = "/usr/share/lua/5.3/?.lua;/usr/share/lua/5.3/?/init.lua;"
  .. "/usr/share/lua/5.2/?.lua;/usr/share/lua/5.2/?/init.lua"
local PRE = ("package.path = package.path .. %q\n"):format(";" .. HTTP_PATH)

local HAS_CQ = H.run_lua('require("cqueues")') == 0
local HAS_HTTP = HAS_CQ and H.run_lua(PRE .. 'require("http.server"); require("http.request")') == 0

-- (with SORTED: print's lines are collected, and written sorted by
-- print_sorted(), for threads whose order cqueues decides)
local SORTED = [[
local lines, print0 = {}, print
print = function(...) -- luacheck: ignore 121
  local t = table.pack(...)
  for i = 1, t.n do t[i] = tostring(t[i]) end
  lines[#lines + 1] = table.concat(t, "\t", 1, t.n)
end
local function print_sorted() table.sort(lines); print0(table.concat(lines, "\n")) end
]]

local function run(code, pre, expected)
  if expected == nil and type(pre) == "table" then pre, expected = nil, pre end
  return H.lua_ok(PRE .. (pre or "") .. code, expected)
end

-- the events of a recorder hook, and a check of the protocol: no event
-- for an id without its init first, one destroy at most, before/after
-- nested
local RECORD = [[
local ah = require("async_hooks")
local ev, seen, stack, problems = {}, {}, {}, {}
local function bad(s) problems[#problems + 1] = s end
local hook = ah.createHook {
  init = function(id, type, trigger)
    if seen[id] then bad("init twice " .. id) end
    seen[id] = "alive"
    ev[#ev + 1] = ("init %d %s %d"):format(id, type, trigger)
  end,
  before = function(id)
    if seen[id] ~= "alive" then bad("before without init " .. id) end
    stack[#stack + 1] = id
    ev[#ev + 1] = "before " .. id
  end,
  after = function(id)
    if stack[#stack] ~= id then bad("after not nested " .. id) end
    stack[#stack] = nil
    ev[#ev + 1] = "after " .. id
  end,
  destroy = function(id)
    if seen[id] ~= "alive" then bad("destroy without init " .. id) end
    seen[id] = "destroyed"
    ev[#ev + 1] = "destroy " .. id
  end,
}:enable()
local function count(kind)
  local n = 0
  for _, e in ipairs(ev) do if e:match("^" .. kind) then n = n + 1 end end
  return n
end
local function protocol_ok()
  assert(#problems == 0, table.concat(problems, "; "))
  assert(#stack == 0, "before without after")
end
]]

describe("cqueues", function()
  if not HAS_CQ then
    pending("skipped: cqueues is not installed (apt-get install lua-cqueues)")
    return
  end

  it("cq:wrap threads read their creator's values, with their arguments", function()
    run([[
      local ah = require("async_hooks").install()
      local cqueues = require("cqueues")
      local v = ah.AsyncLocal.new { default = "default" }
      local cq = cqueues.new()
      v:run("ctx", function()
        cq:wrap(function(...) print(select("#", ...), v:get()) end)
        cq:wrap(function(...) print(select("#", ...), v:get(), ...) end, "a")
        cq:wrap(function(...) print(select("#", ...), v:get(), ...) end, "a", "b")
        cq:wrap(function(...) print(select("#", ...), v:get(), ...) end, "a", nil, "c", nil)
      end)
      cq:wrap(function() print("outside", v:get()) end)
      assert(cq:loop())
      print_sorted()
    ]], SORTED, { "0\tctx", "1\tctx\ta", "2\tctx\ta\tb", "4\tctx\ta\tnil\tc\tnil", "outside\tdefault" })
  end)

  it("a cq:wrap thread has an id of its own and its creator's id as trigger, across sleeps", function()
    run([[
      local ah = require("async_hooks").install()
      local cqueues = require("cqueues")
      local cq = cqueues.new()
      local v = ah.AsyncLocal.new()
      local parent
      cq:wrap(function()
        parent = ah.executionAsyncId()
        v:set("mine")
        cq:wrap(function()
          local id = ah.executionAsyncId()
          assert(id ~= parent and id > 1, "no id of its own")
          assert(ah.triggerAsyncId() == parent, "trigger " .. ah.triggerAsyncId() .. " ~= " .. parent)
          cqueues.sleep(0.001)
          assert(ah.executionAsyncId() == id and ah.triggerAsyncId() == parent, "ids lost across a sleep")
          print(v:get())
        end)
        cqueues.sleep(0.002)
        print(v:get(), ah.triggerAsyncId())
      end)
      assert(cq:loop())
      print_sorted()
    ]], SORTED, { "mine", "mine\t1" })
  end)

  it("auxlib.wrap and auxlib.resume inside a thread: the thread's values, before/after", function()
    run(RECORD .. [[
      ah.install()
      local cqueues = require("cqueues")
      local auxlib = require("cqueues.auxlib")
      local v = ah.AsyncLocal.new()
      local cq = cqueues.new()
      v:run("outer", function()
        cq:wrap(function()
          local f = auxlib.wrap(function() cqueues.sleep(0.001); return v:get() end)
          print(f())
        end)
      end)
      assert(cq:loop())
      print(count("before") >= 2, count("before") == count("after"))
      protocol_ok()
    ]], { "outer", "true\ttrue" })
  end)

  it("cq:attach(coroutine.create(f)) captures the frame of the create call", function()
    run([[
      local ah = require("async_hooks").install()
      local cqueues = require("cqueues")
      local v = ah.AsyncLocal.new()
      local cq = cqueues.new()
      local creator
      v:run("at create", function()
        cq:wrap(function()
          creator = ah.executionAsyncId()
          cq:attach(coroutine.create(function()
            print(v:get(), ah.triggerAsyncId() == creator)
          end))
        end)
      end)
      assert(cq:loop())
    ]], { "at create\ttrue" })
  end)

  it("each thread gets init (type coroutine, its creator as trigger), no slice events, one destroy", function()
    run(RECORD .. [[
      ah.install()
      local cqueues = require("cqueues")
      local cq = cqueues.new()
      local ids = {}
      cq:wrap(function()
        ids.outer = ah.executionAsyncId()
        for i = 1, 3 do -- (with arguments: a first slice of the library's own, unseen)
          assert(cq:wrap(function(j) ids[j] = ah.executionAsyncId(); cqueues.sleep(0.001) end, i) == cq)
        end
        cqueues.sleep(0.002)
      end)
      assert(cq:loop())
      assert(ev[1] == ("init %d coroutine 1"):format(ids.outer), ev[1])
      for i = 1, 3 do
        assert(ev[i + 1] == ("init %d coroutine %d"):format(ids[i], ids.outer), ev[i + 1])
      end
      assert(count("before") == 0 and count("after") == 0, "slice events: " .. table.concat(ev, ", "))
      -- the threads are gone: their destroys arrive at the next step
      cq = nil
      for _ = 1, 6 do collectgarbage() end
      assert(cqueues.new():step(0))
      assert(count("destroy") == 4, table.concat(ev, ", "))
      protocol_ok()
      print("ok")
    ]], { "ok" })
  end)

  it("queued destroys are delivered by cq:step and cq:loop, with no luv and no flush()", function()
    run(RECORD .. [[
      ah.install()
      local cqueues = require("cqueues")
      assert(package.loaded.luv == nil)
      local cq = cqueues.new()
      -- a coroutine of the library's, collected: its destroy is queued
      local co = coroutine.create(function() end)
      co = nil
      for _ = 1, 6 do collectgarbage() end
      assert(count("destroy") == 0, "delivered without a flush point")
      assert(cq:step(0))
      assert(count("destroy") == 1, "not delivered by step")
      co = coroutine.create(function() end)
      co = nil
      for _ = 1, 6 do collectgarbage() end
      cq:wrap(function() end)
      assert(cq:loop())
      assert(count("destroy") == 2, "not delivered by loop")
      protocol_ok()
      print("ok")
    ]], { "ok" })
  end)

  for _, order in ipairs { "before", "after" } do
    it("require('cqueues') " .. order .. " install(): covered, controllers made earlier too", function()
      run(([[
        local order = %q
        local cqueues, early
        if order == "before" then cqueues = require("cqueues"); early = cqueues.new() end
        local ah = require("async_hooks").install()
        if order == "after" then cqueues = require("cqueues"); early = cqueues.new() end
        local v = ah.AsyncLocal.new()
        local late = cqueues.new()
        for _, cq in ipairs { early, late } do
          v:run(order, function() cq:wrap(function() print(v:get(), ah.triggerAsyncId()) end) end)
          assert(cq:loop())
        end
      ]]):format(order), { order .. "\t1", order .. "\t1" })
    end)
  end

  it("uninstall() puts cqueues' own methods back; install() again patches them again", function()
    run([[
      local cqueues = require("cqueues")
      local index = debug.getregistry()["Continuation Queue"].__index
      local orig = { wrap = index.wrap, step = index.step, attach = index.attach, loop = index.loop }
      local ah = require("async_hooks")
      local v = ah.AsyncLocal.new()
      local function seen()
        local cq, got = cqueues.new(), nil
        v:run("ctx", function() cq:wrap(function() got = v:get() end) end)
        assert(cq:loop())
        return tostring(got)
      end
      for round = 1, 2 do
        ah.install()
        assert(index.wrap ~= orig.wrap and index.step ~= orig.step, "not patched")
        assert(index.attach == orig.attach and index.loop == orig.loop, "more than wrap and step patched")
        print(round, seen())
        ah.uninstall()
        for k, f in pairs(orig) do assert(index[k] == f, k .. " not restored") end
        assert(debug.getinfo(index.wrap, "S").what == "C")
        print(round, seen())
      end
    ]], { "1\tctx", "1\tnil", "2\tctx", "2\tnil" })
  end)

  it("a method interposed over the library's stays; uninstall() makes the library's pass through", function()
    run([[
      local cqueues = require("cqueues")
      local ah = require("async_hooks").install()
      local calls = 0
      local prev
      prev = cqueues.interpose("wrap", function(...) calls = calls + 1; return prev(...) end)
      local v = ah.AsyncLocal.new()
      local got = {}
      local function go()
        local cq = cqueues.new()
        v:run("ctx", function() cq:wrap(function() got[#got + 1] = tostring(v:get()) end) end)
        assert(cq:loop())
      end
      go()
      ah.uninstall()
      go()
      ah.install()
      go()
      print(calls, table.concat(got, " "))
    ]], { "3\tctx nil ctx" })
  end)

  it("cq:wrap's and cq:step's own errors are cqueues' messages, names, numbers and positions", function()
    -- every way of calling them: method, field, local alias, tail call,
    -- through pcall; a bad controller, a bad function, none
    local script = [[
      %s
      local cqueues = require("cqueues")
      local cq = cqueues.new()
      print(pcall(cq.wrap, cq, "not a function"))
      print(pcall(cq.wrap, "not a controller", print))
      print(pcall(cq.wrap, cq))
      print(pcall(function() local r = cq:wrap(42); return r end))
      print(pcall(function() return cq:wrap(nil) end))
      print(pcall(function() local r = cq.wrap(cq, {}); return r end))
      print(pcall(function() local w = cq.wrap; local r = w(cq, "x"); return r end))
      print(pcall(function() local r = cq:wrap(); return r end))
      print(pcall(function() local r = cq.wrap({}, print); return r end))
      print(pcall(function() local r = cq.step(nil); return r end))
      print(pcall(cq.step, 1))
      print(pcall(function() local r = cq:loop("x"); return r end))
    ]]
    -- (each run is a new temporary file: its name made "SCRIPT")
    local function norm(out) return (out:gsub("/tmp/[%w_.]+:", "SCRIPT:")) end
    local plain = norm(run(script:format("")))
    assert.equal(12, select(2, plain:gsub("\n", "")))
    assert.matches("SCRIPT:%d+: bad argument #1 to 'wrap' %(function expected, got number%)", plain)
    assert.equal(plain, norm(run(script:format('require("async_hooks").install()'))))
  end)

  it("stand-ins damaged through the debug library raise or pass calls on, never crash", function()
    run([[
      local cqueues = require("cqueues")
      require("async_hooks").install()
      local index = debug.getmetatable(cqueues.new()).__index
      -- (io.lines' iterator: a C function whose upvalues must be a file)
      local junk = { 42, "x", {}, tostring, io.lines("/etc/hostname"), function() end, coroutine.create(print) }
      local n, ok = 0, 0
      for _, name in ipairs({ "wrap", "step" }) do
        local f = index[name]
        for up = 1, 12 do -- cqueues' upvalues copied, then orig's record, mt, impl, post
          local _, keep = debug.getupvalue(f, up)
          for _, v in ipairs(junk) do
            debug.setupvalue(f, up, v)
            local cq = cqueues.new()
            n = n + 1
            if pcall(f, cq, function() end) then ok = ok + 1 end
            pcall(f, 1, 2)
          end
          debug.setupvalue(f, up, keep)
        end
      end
      local cq = cqueues.new()
      assert(cq:wrap(function() end) == cq and cq:loop())
      print(n, ok > 0)
    ]], { "168\ttrue" })
  end)

  it("a failing cq:wrap thread's traceback, with and without arguments, is as without the library", function()
    local script = [[
      %s
      local cqueues = require("cqueues")
      local cq = cqueues.new()
      local function f(a, b) error("boom " .. tostring(a) .. tostring(b)) end
      for _, args in ipairs({ {}, { 1 }, { 1, 2 } }) do
        cq:wrap(f, table.unpack(args))
        local ok, err, _, co = cq:step()
        print(ok, err)
        print(co and debug.traceback(co))
      end
    ]]
    local norm = function(out) return (out:gsub("/tmp/[%w_.]+:", "SCRIPT:")) end
    local plain = norm(run(script:format("")))
    assert.matches("boom 12", plain)
    assert.equal(plain, norm(run(script:format('require("async_hooks").install()'))))
  end)

  it("an error in a wrapped thread reaches cq:loop as without the library", function()
    local script = [[
      %s
      local cqueues = require("cqueues")
      local cq = cqueues.new()
      cq:wrap(function(x) error("boom " .. x, 0) end, "1")
      local ok, err, _, thread = cq:loop()
      print(ok, err, type(thread))
    ]]
    local plain = run(script:format(""))
    assert.equal(plain, run(script:format('require("async_hooks").install()')))
    assert.equal("false\tboom 1\tthread\n", plain)
  end)

  it("cqueues.auxlib's saved resume is the library's while installed", function()
    run(RECORD .. [[
      local auxlib = require("cqueues.auxlib") -- saves coroutine.resume now
      local raw = coroutine.resume
      local function saved()
        for i = 1, 10 do
          local _, val = debug.getupvalue(auxlib.resume, i)
          if val == raw then return "raw" elseif val == ah.coroutine.resume then return "library's" end
        end
      end
      print(saved())
      ah.install()
      print(saved())
      local co = coroutine.create(function() coroutine.yield() end)
      auxlib.resume(co)
      auxlib.resume(co)
      print(count("before"), count("after"))
      ah.uninstall()
      print(saved())
      protocol_ok()
    ]], { "raw", "library's", "2\t2", "raw" })
  end)

  it("auxlib loaded after install() gets its raw resume back at uninstall()", function()
    run([[
      local raw = coroutine.resume
      local ah = require("async_hooks").install()
      local auxlib = require("cqueues.auxlib")
      ah.uninstall()
      local found
      for i = 1, 10 do
        local _, val = debug.getupvalue(auxlib.resume, i)
        if val == raw then found = true end
      end
      print(found)
    ]], { "true" })
  end)

  it("cqueues reloaded (package.loaded cleared): install() again covers its new methods", function()
    run([[
      local ah = require("async_hooks").install()
      require("cqueues")
      for k in pairs(package.loaded) do
        if k == "cqueues" or k == "_cqueues" or k:match("^_?cqueues%.") then package.loaded[k] = nil end
      end
      local cqueues = require("cqueues")
      ah.install()
      local v = ah.AsyncLocal.new()
      local cq = cqueues.new()
      v:run("reloaded", function() cq:wrap(function() print(v:get()) end) end)
      assert(cq:loop())
    ]], { "reloaded" })
  end)

  it("a host metatable on package.loaded: cqueues comes through package.preload", function()
    run([[
      local mt = { __index = function() end }
      setmetatable(package.loaded, mt)
      local ah = require("async_hooks").install()
      assert(type(package.preload.cqueues) == "function", "no preload entry")
      local cqueues = require("cqueues")
      assert(package.preload.cqueues == nil, "the entry stays")
      assert(getmetatable(package.loaded) == mt)
      local v = ah.AsyncLocal.new()
      local cq = cqueues.new()
      v:run("preloaded", function() cq:wrap(function() print(v:get()) end) end)
      assert(cq:loop())
      ah.uninstall()
    ]], { "preloaded" })
  end)

  it("package.loaded's metatable goes once luv and cqueues are both integrated", function()
    run([[
      local ah = require("async_hooks").install()
      assert(debug.getmetatable(package.loaded) ~= nil)
      require("cqueues")
      assert(debug.getmetatable(package.loaded) ~= nil, "luv is still awaited")
      require("luv")
      print(debug.getmetatable(package.loaded))
      ah.uninstall()
    ]], { "nil" })
  end)

  it("where cqueues cannot be required, install() does not wait for it", function()
    -- package.cpath: a folder with luv and the library's core only
    local dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir " .. dir))
    local function link(name, as)
      local path = assert(package.searchpath(name, package.cpath))
      assert(os.execute(("mkdir -p %s/%s && ln -s %s %s/%s"):format(dir, as:match("^(.-)[^/]*$"), path, dir, as)))
    end
    link("luv", "luv.so")
    link("async_hooks.core", "async_hooks/core.so")
    local out = run(([[
      package.cpath = %q
      local ah = require("async_hooks").install()
      print(pcall(require, "cqueues"))
      require("luv")
      print(debug.getmetatable(package.loaded))
    ]]):format(dir .. "/?.so"))
    os.execute("rm -rf " .. dir)
    assert.matches("^false\t.-\nnil\n$", out)
  end)
end)

describe("the lua-http example", function()
  if not HAS_HTTP then
    pending("skipped: cqueues or lua-http is not installed (apt-get install lua-cqueues lua-http)")
    return
  end

  it("answers concurrent requests; every line carries its request id, sub-tasks their handler as trigger", function()
    local n = 8
    local out = run(('arg = {[0] = "examples/lua_http.lua", "%d"}; dofile("examples/lua_http.lua")'):format(n))
    assert.not_matches("MISMATCH", out)
    assert.matches(("%d requests, %d log lines: every line carries its own request's id"):format(n, n * 6), out, 1,
      true)
    -- the check of the spec itself: per request, a handler line and four
    -- sub-task lines whose trigger is the handler's id, all with its id
    local handler = {}
    for id, eid in out:gmatch("%[req (r%d+)%] eid=(%d+) trigger=%d+ handler") do handler[id] = eid end
    for i = 1, n do
      local id = ("r%02d"):format(i)
      assert(handler[id], "no handler line for " .. id)
      local subs = 0
      for trigger in out:gmatch("%[req " .. id .. "%] eid=%d+ trigger=(%d+) sub%-task") do
        assert.equal(handler[id], trigger)
        subs = subs + 1
      end
      assert.equal(4, subs)
    end
  end)
end)
