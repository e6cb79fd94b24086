-- The luv integration's internals, for maintainers: the path taken by
-- callbacks nothing observes, what luv is handed and what a handle keeps
-- for a registration.  What users see is in the other spec/06-luv_*
-- files; these cases check how the C core gets it.
require("luv") -- on the main thread, before anything else
local ah = require("async_hooks")
local H = require("helpers")
local L = require("support.luv")

describe("luv integration internals", function()
  before_each(function() ah.install() end)
  after_each(function() ah.uninstall() end)

  it("untracked callbacks in an empty context take the path with no Lua calls", function()
    H.lua_ok([[
      local uv = require("luv")
      local ah = require("async_hooks").install()
      local core = require("async_hooks.core")
      local t = uv.new_idle()
      local n = 0
      t:start(function() n = n + 1; if n == 100 then t:stop(); t:close() end end)
      uv.run()
      print(n, core.stats().fast_callbacks)
    ]], "100\t100\n")
  end)

  -- Quick records are made only while nothing but a frame observes a
  -- registration, which this process stopped being when a spec first called
  -- executionAsyncResource(): each of these runs in a fresh one.
  describe("quick records (a request, or the first registration on a fresh handle, observed by a frame only)", function()
    local PRELUDE = L.PRELUDE .. [[
      -- what luv holds for the callback cb: the quick record is a C closure
      -- whose first upvalue is cb
      local function held_by_luv(cb)
        for _, x in pairs(debug.getregistry()) do
          if x == cb then return "the callback" end
          if type(x) == "function" and select(2, debug.getupvalue(x, 1)) == cb then
            return debug.getinfo(x, "S").what == "C" and "a C closure over it" or "?"
          end
          if type(x) == "userdata" and select(2, pcall(debug.getuservalue, x, 1)) == cb then
            return "a record"
          end
        end
        return "nothing"
      end
    ]]
    local function fresh(code, expected)
      H.lua_ok(PRELUDE .. code, expected)
    end

    it("luv gets a function; the handle keeps a mark, and its re-arm a record it then reuses", function()
      fresh([[
        local t = uv.new_timer()
        local kept, seen = {}, {}
        local function step()
          seen[#seen + 1] = v:get()
          kept[#kept + 1] = debug.getuservalue(t, 1)
          if #seen < 5 then t:start(0, 0, step) else t:close() end
        end
        local held, read
        v:run("q", function() t:start(0, 0, step); held = held_by_luv(step) end)
        local cb = function(_, data) read = data .. ":" .. v:get() end
        v:run("r", function() uv.fs_read(fd, 3, 0, cb) end)
        print(held, held_by_luv(cb))
        uv.run()
        -- kept: what the handle keeps at each step, before it re-arms
        print(table.concat(seen, " "), read, kept[1], type(kept[2]), type(kept[3]),
              kept[3] == kept[4], kept[4] == kept[5])
      ]], "a C closure over it\ta C closure over it\n"
        .. "q q q q q\tabc:r\ttrue\tuserdata\tfunction\ttrue\ttrue\n")
    end)

    -- with hooks enabled a request is still a quick record (its destroy
    -- follows its one callback): its resource is made for its init, kept in
    -- the closure, and is the callback's executionAsyncResource()
    it("a request made while hooks are enabled: init, before, after, destroy, one resource", function()
      fresh([[
        local ev, inits = {}, {}
        local mine
        ah.createHook {
          init = function(id, type, trigger, res)
            if type == "uv_fs" then mine = id; inits[id] = res; ev[#ev + 1] = "init" end
          end,
          before = function(id) if id == mine then ev[#ev + 1] = "before" end end,
          after = function(id) if id == mine then ev[#ev + 1] = "after" end end,
          destroy = function(id) if id == mine then ev[#ev + 1] = "destroy" end end,
        }:enable()
        local seen
        local cb = function(_, data)
          ev[#ev + 1] = "cb"
          seen = { ah.executionAsyncId() == mine, ah.executionAsyncResource(), data }
        end
        local trigger = ah.executionAsyncId()
        uv.fs_read(fd, 3, 0, cb)
        print(held_by_luv(cb), inits[mine].op, inits[mine].handle)
        uv.run()
        uv.run() -- delivers the destroy queued at the callback's exit
        print(table.concat(ev, " "), seen[1], seen[2] == inits[mine], seen[3], trigger == 1)
      ]], "a C closure over it\tfs_read\tnil\ninit before cb after destroy\ttrue\ttrue\tabc\ttrue\n")
    end)

    it("a resource whose length is a record's size is not taken for its record", function()
      -- a table's raw length is its border: a resource with as many array
      -- entries as a record has bytes once passed for a record (a crash)
      for _, how in ipairs { "slow", "uninstall" } do
        fresh(([[
          local how, k, ops = %q, 0, {}
          local size = core.luv_record_size
          local t = uv.new_timer()
          v:run(1, function()
            t:start(1, 1, function()
              k = k + 1
              local res = ah.executionAsyncResource()
              if k == 1 then for i = 1, size do res[i] = i end end
              ops[k] = tostring(res.op) .. ":" .. tostring(#res == size) .. ":" .. tostring(v:get())
              if k == 1 and how == "uninstall" then ah.uninstall() end
              if k == 3 then t:close() end
            end)
          end)
          uv.run()
          print(table.concat(ops, " "), size > 0)
        ]]):format(how), "timer_start:true:1 timer_start:true:1 timer_start:true:1\ttrue\n")
      end
    end)

    -- review finding (older): luv refusing a call with nil, err (the
    -- callback will never run) left an init without a destroy
    it("a registration luv refuses with nil, err gets no init (and so no destroy)", function()
      for _, hooks in ipairs { "init", "init,destroy" } do
        fresh(([[
          local inits, destroys = {}, 0
          ah.createHook {
            init = function(id, type) if type == "uv_timer" then inits[#inits + 1] = id end end,
            destroy = %s,
          }:enable()
          local t = uv.new_timer()
          t:close()
          local r, err = t:start(0, 0, function() end) -- a closing handle
          uv.run()
          local t2 = uv.new_timer()
          t2:start(0, 0, function() t2:close() end)
          uv.run()
          print(r, type(err), #inits, (debug.getuservalue(t, 1)))
        ]]):format(hooks == "init" and "nil" or "function() destroys = destroys + 1 end"),
          "nil\tstring\t1\tnil\n")
      end
    end)

    it("a handle luv refused keeps nothing", function()
      fresh([[
        local idle, t = uv.new_idle(), uv.new_timer()
        local ok
        v:run(1, function() ok = pcall(uv.timer_start, idle, 0, 0, function() end) end)
        v:run(1, function() t:start(0, 0, function() t:close() end) end)
        uv.run()
        idle:close()
        uv.run()
        print(ok, (debug.getuservalue(idle, 1)), (debug.getuservalue(t, 1)))
      ]], "false\tnil\ttrue\n")
    end)
  end)
  -- A tracked callback's frame is written where the thread's frame is kept
  -- only once something reads it: each case checks that whatever reads it
  -- first, at whatever depth, sees the callback's context, and that the
  -- caller's is back afterwards.  Fresh processes (quick records), and
  -- re-armed timers (records).
  describe("a callback's context, read first from anywhere", function()
    -- t0 fires `n` times, each in v = "a<i>" (quick record, then re-armed
    -- records); body(i) runs in the callback
    local CHAIN = [[
      local function chain(n, body)
        local t, i = uv.new_timer(), 0
        local function arm()
          i = i + 1
          v:run("a" .. i, function() t:start(0, 0, function()
            body(i)
            if i < n then arm() else t:close() end
          end) end)
        end
        arm()
        uv.run()
        print("after", v:get())
      end
    ]]

    it("a coroutine created in a callback that read nothing", function()
      L.fresh(CHAIN .. [[
        v:set("top")
        chain(2, function()
          local co = coroutine.create(function() return v:get() end)
          print(select(2, coroutine.resume(co)), v:get())
        end)
      ]], "a1\ta1\na2\ta2\nafter\ttop\n")
    end)

    it("a coroutine resumed in a callback reads its own context, then the callback its own", function()
      L.fresh(CHAIN .. [[
        local co
        v:run("co", function()
          co = coroutine.wrap(function() while true do coroutine.yield(v:get()) end end)
        end)
        chain(2, function() local c = co(); print(c, v:get()) end)
      ]], "co\ta1\nco\ta2\nafter\tclean\n")
    end)

    it("a nested uv.run: the inner callbacks' and the outer one's", function()
      L.fresh(CHAIN .. [[
        local t2 = uv.new_timer()
        chain(2, function(i)
          v:run("b" .. i, function() t2:start(0, 0, function() print("inner", v:get()) end) end)
          uv.run()
          print("outer", v:get())
        end)
        t2:close()
        -- t3 reads nothing before the nested loop, whose callback (t4's,
        -- registered outside) reads
        local t3, t4 = uv.new_timer(), uv.new_timer()
        v:run("d", function()
          t4:start(20, 0, function() print("inner", v:get()); t4:close() end)
        end)
        v:run("c", function() t3:start(0, 0, function()
          uv.run()
          print("outer", v:get())
          t3:close()
        end) end)
        uv.run()
        print("end", v:get())
      ]], "inner\tb1\nouter\ta1\ninner\tb2\nouter\ta2\nafter\tclean\n" ..
          "inner\td\nouter\tc\nend\tclean\n")
    end)

    it("a nested run of luv's own uv.run", function()
      L.fresh(CHAIN .. [[
        local rawrun = package.loaded["luv.rawrun"]
        local t3, t4 = uv.new_timer(), uv.new_timer()
        v:run("d", function()
          t4:start(20, 0, function() print("inner", v:get()); t4:close() end)
        end)
        v:run("c", function() t3:start(0, 0, function()
          rawrun()
          print("outer", v:get())
          t3:close()
        end) end)
        uv.run()
        print("end", v:get())
      ]], "inner\td\nouter\tc\nend\tclean\n")
    end)

    it("a Snapshot taken in a callback", function()
      L.fresh(CHAIN .. [[
        local snaps = {}
        chain(2, function(i) snaps[i] = ah.Snapshot.new() end)
        for i = 1, 2 do snaps[i]:run(function() print(v:get()) end) end
        print(v:get())
      ]], "after\tclean\na1\na2\nclean\n")
    end)

    -- an error ends the callback before it re-arms: fresh timers (quick
    -- records), and a repeating one (its closure runs each time)
    local ERRORS = [[
      core.luv_flags(1 + 4) -- luv: no exit, no message
      v:set("top")
      local ts = {}
      for i = 1, 2 do
        ts[i] = uv.new_timer()
        v:run("e" .. i, function() ts[i]:start(0, 0, function() body(i); error("boom") end) end)
      end
      local rep, n = uv.new_timer(), 0
      v:run("rep", function() rep:start(0, 1, function()
        n = n + 1
        if n == 3 then rep:close(); for i = 1, 2 do ts[i]:close() end; return end
        body(n); error("boom")
      end) end)
      uv.run()
      core.luv_flags(0)
      print("after", v:get())
    ]]

    it("an error in a callback that read the context", function()
      L.fresh("local function body(i) print(v:get()) end\n" .. ERRORS,
              "e1\ne2\nrep\nrep\nafter\ttop\n")
    end)

    it("an error in a callback that read nothing", function()
      L.fresh("local function body() end\n" .. ERRORS, "after\ttop\n")
    end)

    it("a scope opened in a callback that read nothing", function()
      L.fresh(CHAIN .. [[
        chain(2, function(i) v:run("s" .. i, function() print(v:get()) end); print(v:get()) end)
      ]], "s1\na1\ns2\na2\nafter\tclean\n")
    end)

    it("hooks that read the context", function()
      L.fresh(CHAIN .. [[
        local log = {}
        ah.createHook {
          before = function() log[#log + 1] = "before " .. v:get() end,
          after = function() log[#log + 1] = "after " .. v:get() end,
        }:enable()
        chain(2, function() log[#log + 1] = "cb" end)
        print(table.concat(log, ", "))
      ]], "after\tclean\nbefore a1, cb, after a1, before a2, cb, after a2\n")
    end)

    it("a file request's callback that reads nothing, then one that reads", function()
      L.fresh([[
        v:run("r1", function() uv.fs_fstat(fd, function()
          v:run("r2", function() uv.fs_fstat(fd, function() print(v:get()) end) end)
        end) end)
        uv.run()
        print(v:get())
      ]], "r2\nclean\n")
    end)
  end)
end)
